"""Constant folding at load (`pipeline.interpreter.fold`): instructions that read only constants
run once when a program is built, and what every call computes stays bit for bit the same."""

from collections import Counter
from functools import cache

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.export import Dim

import pipeline
from pipeline import runtime
from pipeline.interpreter import fold
from pipeline.pte import verify
from pipeline.interpreter.program import Program
from pipeline.pte.file import PteFile
from support.inputs import randn, seeded
from support.models import Block, Decoder, TinyViT

pytestmark = pytest.mark.usefixtures("gpu_info")

PERMUTE = "aten::permute_copy.out"


def unfolded(prog: Program) -> Program:
    """The same bytes, every instruction left in the chain."""
    return Program(PteFile(prog.buffer, "unfolded"), fold=False)


def steps_run(prog: Program, *inputs) -> Counter:
    timings: list[tuple[str, float]] = []
    prog(*inputs, timings=timings)
    return Counter(label for label, _ in timings)


def assert_bit_identical(got, want) -> None:
    got_leaves, want_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), f"output {i} differs"


class Windows(nn.Module):
    """A linear over windows cut out of a larger tensor (Florence-2's DaViT): the rows are not
    one view, so the linear becomes a bmm whose weight the plan transposes, expands to the
    batch and reads through a static reshape: a second name for the folded bytes."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):  # x: [B, 2, 3, 2, 3, dim]
        windows = x.permute(0, 1, 3, 2, 4, 5).reshape(-1, 9, x.shape[-1])[:, 1:]
        return self.norm(self.proj(windows))


class Positions(nn.Module):
    """Position embeddings from constant ids (Whisper's encoder): folded at load, while the
    memory they were planned in is reused by the projections that follow, which are read
    through static reshapes over those same bytes: names that must not see the fold."""

    def __init__(self, length: int = 6, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.pos = nn.Embedding(length, dim)
        self.q, self.k = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        h = x + self.pos(torch.arange(t))
        q = self.q(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = self.k(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        attention = (q @ k.transpose(2, 3)).softmax(-1)
        return self.norm(h + (attention @ q).transpose(1, 2).reshape(b, t, d))


class ConstantNorm(nn.Module):
    """A LayerNorm of a parameter alone: its input is a constant, yet it stays a delegate call."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(randn(4, 8, seed=2))
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return x + self.norm(self.table)


class Noise(nn.Module):
    """Random draws read no tensor at all, yet must be drawn on every call."""

    def forward(self, x):
        return x + torch.rand(4)


EXAMPLES = {
    "block": (Block, (randn(2, 10, 32),), (randn(2, 10, 32, seed=1),)),
    "vit": (TinyViT, (randn(2, 3, 16, 16),), (randn(2, 3, 16, 16, seed=1),)),
    "windows": (Windows, (randn(2, 2, 3, 2, 3, 8),), (randn(2, 2, 3, 2, 3, 8, seed=1),)),
    "positions": (Positions, (randn(1, 6, 8),), (randn(1, 6, 8, seed=1),)),
}


@cache
def lowered(name: str) -> Program:
    make, inputs, _ = EXAMPLES[name]
    return pipeline.lower(seeded(make()), inputs)


def test_linear_weights_are_transposed_once_at_load():
    _, (x,), _ = EXAMPLES["block"]
    prog = lowered("block")
    before = unfolded(prog)
    folded = Counter(before.step_labels[pc] for pc in prog.folded)
    assert folded[PERMUTE] == 4  # qkv, proj and the MLP's two linears
    assert steps_run(before, x)[PERMUTE] - steps_run(prog, x)[PERMUTE] == 4
    assert prog.step_labels.count(PERMUTE) == before.step_labels.count(PERMUTE) - 4
    # The transposed weights are the fold's memory: 32x96, 32x32, 32x128 and 128x32 floats.
    assert prog.folded_bytes >= 4 * (32 * 96 + 32 * 32 + 2 * 32 * 128)
    assert before.folded == () and before.folded_bytes == 0


@pytest.mark.parametrize("name", EXAMPLES)
def test_folded_program_is_bit_identical_to_the_unfolded_one(name):
    _, inputs, fresh = EXAMPLES[name]
    prog = lowered(name)
    assert prog.folded
    before = unfolded(prog)
    for args in (inputs, fresh, inputs):  # a second call sees the folded constants untouched
        assert_bit_identical(prog(*args), before(*args))


def test_a_folded_output_read_under_another_name_is_bound_to_the_fold():
    prog = unfolded(lowered("windows"))
    found = fold.plan_fold(prog._plan, prog._shape_rules(), budget=2**30)
    assert found.aliases and set(found.aliases.values()) <= set(found.outputs)


def test_dynamic_program_folds_and_stays_identical_at_every_length():
    tokens = lambda t, seed: torch.randint(0, 50, (2, t), generator=torch.Generator().manual_seed(seed))  # noqa: E731
    prog = pipeline.lower(seeded(Decoder()), (tokens(8, 0),), ({1: Dim("seq", min=2, max=64)},))
    assert prog.folded
    before = unfolded(prog)
    for t in (3, 37, 8):
        assert_bit_identical(prog(tokens(t, t)), before(tokens(t, t)))


def test_a_layer_norm_of_constants_stays_on_the_delegate():
    x = randn(4, 8)
    prog = pipeline.lower(seeded(ConstantNorm()), (x,))
    assert prog.coverage.complete and prog.num_delegates == 1
    assert steps_run(prog, x)["delegate"] == 1
    dispatches = runtime.stats()["dispatches"]
    prog(x)
    assert runtime.stats()["dispatches"] > dispatches
    assert_bit_identical(prog(x), unfolded(prog)(x))


def test_random_draws_are_not_folded():
    x = torch.zeros(4)
    prog = pipeline.lower(Noise(), (x,))
    assert not any("rand" in unfolded(prog).step_labels[pc] for pc in prog.folded)
    assert not torch.equal(prog(x), prog(x))


def test_the_budget_bounds_what_the_fold_holds():
    prog = unfolded(lowered("block"))
    placed = verify.planned(prog._plan)
    found = fold.plan_fold(prog._plan, prog._shape_rules(), budget=0)
    assert all(placed[j][1] == placed[j][2] for j in found.outputs)
    assert not any(prog.step_labels[pc] == PERMUTE for pc in found.instructions)


def test_timings_cover_every_step_of_the_call():
    _, (x,), _ = EXAMPLES["block"]
    prog = lowered("block")
    timings: list[tuple[str, float]] = []
    assert_bit_identical(prog(x, timings=timings), prog(x))
    assert [label for label, _ in timings] == list(prog.step_labels)
    assert all(seconds >= 0 for _, seconds in timings)
