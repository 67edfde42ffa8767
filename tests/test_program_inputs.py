"""A Program refuses inputs it cannot run, up front, with a ValueError or TypeError naming the
input: tensors without CPU data or not dense, structures nested past the signature, sizes
outside what a dynamic program was exported for."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import pipeline
from pipeline import native
from support.inputs import randn
from support.models import DynamicModel as Norms  # a LayerNorm over rows, a GroupNorm over a length

pytestmark = pytest.mark.usefixtures("gpu_info")


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """The same module lowered static and dynamic (rows and length from 2 to 32), and the
    dynamic one loaded from its file (which records upper bounds only)."""
    module = Norms().eval()
    inputs = (randn(6, 16), randn(2, 4, 9, seed=1))
    static = pipeline.lower(module, inputs)
    dynamic = pipeline.lower(module, inputs, dynamic_shapes=({0: Dim("rows", min=2, max=32)},
                                                             {2: Dim("length", min=2, max=32)}))
    path = tmp_path_factory.mktemp("inputs") / "dynamic.pte"
    dynamic.save(path)
    return module, inputs, static, dynamic, pipeline.load(path)


def _nested(depth: int):
    value = randn(6, 16)
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda x, y: (x.to("meta"), y), TypeError, "input 0 is a meta tensor"),
        (lambda x, y: (x, y.to_sparse()), TypeError, "input 1 has layout torch.sparse_coo"),
        (lambda x, y: (torch.nested.nested_tensor([x, x]), y), TypeError, "input 0 is a nested tensor"),
        (lambda x, y: (_nested(5000), y), TypeError, "nested deeper than the program's signature"),
        (lambda x, y: (x, [y]), TypeError, "signature"),
    ],
)
def test_inputs_without_dense_cpu_data_or_too_deep_are_refused(programs, make, error, message):
    _, (x, y), static, dynamic, loaded = programs
    for program in (static, dynamic, loaded):
        with pytest.raises(error, match=message):
            program(*make(x, y))


def test_a_dynamic_size_below_the_export_range_names_the_input(programs):
    module, (x, y), _, dynamic, loaded = programs
    # Lowered here: the exported range is known.
    with pytest.raises(ValueError, match=r"input 1 has size 0 in dim 2; .* sizes 2 to 32"):
        dynamic(x, randn(2, 4, 0))
    with pytest.raises(ValueError, match=r"input 0 has size 1 in dim 0"):
        dynamic(randn(1, 16), y)
    # From the file (upper bounds only): a length the program cannot run at is refused by
    # shape propagation, naming the input shapes, not an argument the caller never passed.
    with pytest.raises(ValueError, match=r"inputs of shapes \[\[6, 16\], \[2, 4, 0\]\]: the program cannot run"):
        loaded(x, randn(2, 4, 0))
    for rows, length in ((2, 2), (32, 32), (7, 5)):
        inputs = (randn(rows, 16, seed=rows), randn(2, 4, length, seed=length))
        with torch.no_grad():
            want = module(*inputs)
        for program in (dynamic, loaded):
            got = program(*inputs)
            assert all(torch.allclose(g, w, atol=2e-4) for g, w in zip(got, want))


class Scaled(torch.nn.Module):
    """A LayerNorm, then a product with a plain int input."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return self.norm(x) * k


def test_a_plain_value_other_than_the_exported_one_is_refused_by_both_runtimes(tmp_path):
    x = randn(4, 16)
    program = pipeline.lower(Scaled().eval(), (x, 3))
    path = tmp_path / "scaled.pte"
    program.save(path)
    for run in (program, pipeline.load(path), native.load(path)):
        with pytest.raises(ValueError, match="input 1: the program was exported for the value 3, got 4"):
            run(x, 4)
