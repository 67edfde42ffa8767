"""pipeline.lower end to end: every LayerNorm delegated, outputs equal to eager on fresh inputs."""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from executorch.exir import to_edge_transform_and_lower
from torch import nn
from torch.export import Dim

import pipeline
from pipeline import blob
from pipeline.aot.lowering import export_for_cpu_backend
from pipeline.aot.partitioner import LayerNormPartitioner
from pipeline.interpreter.program import Program
from pipeline.pte.file import PteFile
from pipeline.runtime import stats
from support.inputs import randn, seeded
from support.lowering import lower_and_compare
from support.models import Block, Decoder, TinyViT
from support.reference import assert_same_outputs

pytestmark = pytest.mark.usefixtures("gpu_info")


@pytest.mark.parametrize("affine, bias", [(False, False), (True, False), (True, True)])
def test_layer_norm_module_affine_combinations(affine, bias):
    model = seeded(nn.Sequential(nn.Linear(12, 20), nn.LayerNorm(20, elementwise_affine=affine, bias=bias)))
    lower_and_compare(model, (randn(3, 12),), [(randn(3, 12, seed=1),)], layer_norms=1)


class FunctionalLayerNorm(nn.Module):
    def __init__(self, weight: bool, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(randn(7, seed=3)) if weight else None
        self.bias = nn.Parameter(randn(7, seed=4)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, (7,), self.weight, self.bias, eps=1e-3)


@pytest.mark.parametrize("weight, bias", [(True, False), (False, True)])
def test_functional_layer_norm_weight_or_bias_only(weight, bias):
    lower_and_compare(FunctionalLayerNorm(weight, bias), (randn(2, 5, 7),), [(randn(2, 5, 7, seed=1),)], layer_norms=1)


class RuntimeAffine(nn.Module):
    """Weight computed at run time, and one parameter shared by two LayerNorms: both reach
    the delegate as runtime inputs rather than blob constants."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Parameter(randn(9, seed=5))

    def forward(self, x, scale):
        y = F.layer_norm(x, (9,), scale * 2.0, self.shared)
        return F.layer_norm(y, (9,), self.shared, None)


def test_runtime_weight_and_bias_inputs():
    prog = lower_and_compare(RuntimeAffine(), (randn(4, 9), randn(9, seed=1)), [(randn(6, 9, seed=2), randn(9, seed=3))],
                             dynamic_shapes=({0: Dim("rows", max=64)}, None), layer_norms=2)
    sources = sorted(
        (d.params.weight.source, d.params.bias.source) for d in prog.delegates
    )
    assert sources == [(blob.INPUT, blob.INPUT), (blob.INPUT, blob.NONE)]


@pytest.mark.parametrize("shape", [(4, 6), (3, 5), (2, 3, 5)])
def test_multi_dim_normalized_shape(shape):
    model = seeded(nn.LayerNorm(shape))
    lower_and_compare(model, (randn(2, 3, *shape),), [(randn(2, 3, *shape, seed=1),)], layer_norms=1)


@pytest.mark.parametrize(
    "groups, channels, spatial, affine",
    [(1, 6, (5, 7), True), (6, 6, (5, 7), True), (3, 9, (5, 3), False), (2, 6, (11,), True), (4, 12, (), True)],
    ids=["G=1", "G=C", "no-affine-group-of-3", "1d-odd-length", "no-spatial"],
)
def test_group_norm(groups, channels, spatial, affine):
    model = seeded(nn.GroupNorm(groups, channels, affine=affine))
    shape = (2, channels, *spatial)
    lower_and_compare(model, (randn(*shape),), [(randn(*shape, seed=1) * 3 + 1,)], layer_norms=1)


@pytest.fixture(scope="module")
def block_program():
    return lower_and_compare(seeded(Block()), (randn(2, 10, 32),), [(randn(2, 10, 32, seed=1),)], layer_norms=2)


def test_transformer_block(block_program):
    assert block_program.num_delegates == 2


def test_vit_like_model():
    lower_and_compare(seeded(TinyViT()), (randn(2, 3, 16, 16),), [(randn(2, 3, 16, 16, seed=1),)], layer_norms=3)


class ChannelsFirstNorm(nn.Module):
    """ConvNeXt-style: LayerNorm over channels of an NCHW map via permutes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 10, 3, padding=1)
        self.norm = nn.LayerNorm(10)

    def forward(self, x):
        y = self.conv(x).permute(0, 2, 3, 1)
        return self.norm(y).permute(0, 3, 1, 2)


def test_channels_first_layer_norm_via_permute():
    lower_and_compare(seeded(ChannelsFirstNorm()), (randn(2, 3, 7, 5),), [(randn(2, 3, 7, 5, seed=1),)], layer_norms=1)


def test_conv_net_with_group_norms_of_several_group_counts():
    model = seeded(nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.GroupNorm(1, 8), nn.ReLU(),
        nn.Conv2d(8, 12, 3, padding=1), nn.GroupNorm(4, 12), nn.SiLU(),
        nn.Conv2d(12, 12, 3, stride=2), nn.GroupNorm(12, 12), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 5),
    ))
    lower_and_compare(model, (randn(2, 3, 11, 9),), [(randn(2, 3, 11, 9, seed=1),)], layer_norms=3)


class AudioFeatureEncoder(nn.Module):
    """wav2vec-style: strided Conv1d stack, GroupNorm with G=C on the first layer, then LayerNorm."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.conv0, self.norm0 = nn.Conv1d(1, dim, 10, stride=5, bias=False), nn.GroupNorm(dim, dim)
        self.conv1 = nn.Conv1d(dim, dim, 3, stride=2, bias=False)
        self.proj_norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 24)

    def forward(self, audio):
        x = F.gelu(self.norm0(self.conv0(audio[:, None])))
        x = F.gelu(self.conv1(x)).transpose(1, 2)
        return self.proj(self.proj_norm(x))


def test_audio_feature_encoder_with_group_norm():
    lower_and_compare(seeded(AudioFeatureEncoder()), (randn(2, 400),), [(randn(2, 400, seed=1),)], layer_norms=2)


def test_decoder_with_dynamic_sequence_length():
    tokens = lambda t, seed: torch.randint(0, 50, (2, t), generator=torch.Generator().manual_seed(seed))  # noqa: E731
    prog = lower_and_compare(
        seeded(Decoder()), (tokens(8, 0),), [(tokens(3, 1),), (tokens(37, 2),)],
        dynamic_shapes=({1: Dim("seq", min=2, max=64)},), layer_norms=3,
    )
    assert prog.num_delegates == 3
    with pytest.raises(ValueError, match="outside what the program was exported for"):
        prog(tokens(65, 3))


class AudioFeatures(nn.Module):
    """A wav2vec-style feature encoder: strided Conv1d + GroupNorm(C, C) over a dynamic length."""

    def __init__(self) -> None:
        super().__init__()
        self.conv0 = nn.Conv1d(1, 8, 10, stride=5)
        self.norm0 = nn.GroupNorm(8, 8)
        self.conv1 = nn.Conv1d(8, 8, 3, stride=2)
        self.norm1 = nn.GroupNorm(2, 8, affine=False)

    def forward(self, wave):
        h = F.gelu(self.norm0(self.conv0(wave)))
        return self.norm1(self.conv1(h))


def test_group_norm_over_a_dynamic_length():
    wave = lambda n, seed: randn(2, 1, n, seed=seed)  # noqa: E731
    lower_and_compare(
        seeded(AudioFeatures()), (wave(400, 0),), [(wave(163, 1),), (wave(1001, 2),)],
        dynamic_shapes=({2: Dim("samples", min=100, max=2000)},), layer_norms=2,
    )


class NormStatistics(nn.Module):
    """Uses the statistics outputs: LayerNorm's (N, T, 1) and GroupNorm's (N, G)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(randn(6, seed=1)), nn.Parameter(randn(6, seed=2))

    def forward(self, x):
        out, _, rstd = torch.native_layer_norm(x, [6], self.weight, self.bias, 1e-5)
        g_out, g_mean, g_rstd = torch.ops.aten.native_group_norm(out.transpose(1, 2).contiguous(), None, self.bias, 2, 6, 5, 3, 1e-5)
        return rstd, g_out, g_mean, g_rstd


def test_statistics_outputs_come_from_the_delegate():
    prog = lower_and_compare(NormStatistics(), (randn(2, 5, 6),), [(randn(2, 5, 6, seed=1),)], layer_norms=2)
    assert sorted(sorted(d.params.outputs) for d in prog.delegates) == [[0, 1, 2], [0, 2]]


class MixedPrecision(nn.Module):
    """Two LayerNorms the kernel cannot run (float64, bfloat16) between two it can."""

    def __init__(self) -> None:
        super().__init__()
        self.ln32a, self.ln32b = nn.LayerNorm(8), nn.LayerNorm(8)
        self.ln64 = nn.LayerNorm(8).double()
        self.ln16 = nn.LayerNorm(8).to(torch.bfloat16)

    def forward(self, x):
        y = self.ln64(self.ln32a(x).double()).float()
        z = self.ln16(x.to(torch.bfloat16)).float()
        return self.ln32b(y + z)


def test_unsupported_layer_norms_are_reported_and_still_run(caplog):
    model = seeded(MixedPrecision())
    with caplog.at_level("WARNING", logger="pipeline.aot.partitioner"):
        prog = lower_and_compare(model, (randn(3, 8),), [(randn(5, 8, seed=1),)], complete=False,
                                 dynamic_shapes=({0: Dim("rows", max=32)},), layer_norms=4)
    cov = prog.coverage
    # bfloat16 is delegated (the half kernel); float64 is not.
    assert cov.delegated == 3 and len(cov.not_delegated) == 1
    reasons = " ".join(reason for _, reason in cov.not_delegated)
    assert "torch.float64" in reasons
    assert all(name in caplog.text for name, _ in cov.not_delegated)


def test_outputs_keep_the_module_structure():
    class Structured(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(4)

        def forward(self, x, extra):
            y = self.ln(x)
            return {"normed": y, "pair": (y.sum(-1), extra * 2)}

    model = Structured().eval()
    inputs = (randn(2, 4), randn(3))
    prog = lower_and_compare(model, inputs, layer_norms=1)
    assert set(prog(*inputs)) == {"normed", "pair"}
    with pytest.raises(TypeError, match="inputs do not match"):
        prog(randn(2, 4))
    with pytest.raises(ValueError, match="outside what the program was exported for"):
        prog(randn(3, 4), randn(3))


def test_dispatches_counted_per_call(block_program):
    before = stats()["dispatches"]
    for seed in range(3):
        block_program(randn(2, 10, 32, seed=seed))
    assert stats()["dispatches"] - before >= 3 * block_program.coverage.delegated


def test_save_writes_a_valid_executorch_program(block_program, tmp_path):
    from executorch.exir._serialize._program import deserialize_pte_binary

    prog = block_program
    path = tmp_path / "block.pte"
    prog.save(path)
    data = path.read_bytes()
    assert len(data) > 0 and data[4:8] == b"ET12"
    program = deserialize_pte_binary(data).program
    delegates = program.execution_plan[0].delegates
    assert [d.id for d in delegates] == ["WebGPUBackend"] * 2
    # The blobs inside the .pte are ours and decode.
    decoded = [blob.decode(bytes(program.backend_delegate_data[d.processed.index].data)) for d in delegates]
    assert all(d.params.normalized_shape == (32,) and set(d.constants) == {"weight", "bias"} for d in decoded)
    assert not list(tmp_path.glob(".*.tmp"))
    # Saving leaves the program runnable and its edge graph in the edge dialect.
    x = randn(2, 10, 32, seed=7)
    assert_same_outputs(prog(x), prog.edge.exported_program().module()(x))


class Branching(nn.Module):
    """LayerNorms inside torch.cond branches."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.ln2 = nn.LayerNorm(8), nn.LayerNorm(8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.ln(x), lambda x: self.ln2(x) * 2, (x,))


def test_layer_norms_in_control_flow_are_counted_and_reported_not_delegated():
    from pipeline.evaluation import audit_coverage

    module = Branching().eval()
    x = randn(3, 8)
    prog = pipeline.lower(module, (x,))
    cov = prog.coverage
    assert (cov.total, cov.delegated, cov.complete) == (2, 0, False)
    assert all("control flow" in reason for _, reason in cov.not_delegated)
    for inputs in (x, -x.abs(), x.abs()):  # both branches run, through the program's jumps
        assert_same_outputs(prog(inputs), module(inputs))
    audit = audit_coverage(module, (x,), prog)
    assert not audit.complete and audit.graph_ops == 2 and audit.delegated == 0 and audit.eager_calls == 1


class GroupNormInUntakenBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: self.gn(x), (x,))


def test_group_norm_in_control_flow_is_counted_and_reported_not_delegated(tmp_path):
    from pipeline.evaluation import audit_coverage

    module = GroupNormInUntakenBranch().eval()
    x = randn(2, 4, 5).abs()  # eager takes the branch without the GroupNorm
    prog = pipeline.lower(module, (x,))
    cov = prog.coverage
    assert (cov.total, cov.delegated, cov.complete) == (1, 0, False)
    assert "control flow" in cov.not_delegated[0][1]
    prog.save(tmp_path / "branch.pte")
    in_file = pipeline.load(tmp_path / "branch.pte").coverage
    assert (in_file.total, in_file.delegated) == (cov.total, cov.delegated)
    assert_same_outputs(prog(-x), module(-x))
    assert not audit_coverage(module, (x,), prog).complete


# -- constants folded at export ---------------------------------------------------------

PERMUTE = "aten::permute_copy.out"


def unfolded(module: nn.Module, inputs: tuple, dynamic_shapes=None) -> Program:
    """What `pipeline.lower` makes of `module`, serialized without folding constants."""
    exported, _ = export_for_cpu_backend(module, inputs, dynamic_shapes)
    edge = to_edge_transform_and_lower(exported, partitioner=[LayerNormPartitioner()])
    return Program(PteFile(edge.to_executorch().buffer, "unfolded"))


def assert_bit_identical(got, want) -> None:
    got_leaves, want_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), f"output {i} differs"


def steps_run(prog: Program, *inputs) -> Counter:
    timings: list[tuple[str, float]] = []
    prog(*inputs, timings=timings)
    return Counter(label for label, _ in timings)


class Windows(nn.Module):
    """A linear over windows cut out of a larger tensor (Florence-2's DaViT): the rows are not
    one view, so the linear becomes a bmm whose weight the plan transposes and expands to
    the batch; the transpose is folded, the expand (a broadcast) is not."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):  # x: [B, 2, 3, 2, 3, dim]
        windows = x.permute(0, 1, 3, 2, 4, 5).reshape(-1, 9, x.shape[-1])[:, 1:]
        return self.norm(self.proj(windows))


class Positions(nn.Module):
    """Position embeddings from constant ids (Whisper's encoder): arange and embedding fold."""

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


FOLDED = {
    "block": (Block, (randn(2, 10, 32),), (randn(2, 10, 32, seed=1),)),
    "windows": (Windows, (randn(2, 2, 3, 2, 3, 8),), (randn(2, 2, 3, 2, 3, 8, seed=1),)),
    "positions": (Positions, (randn(1, 6, 8),), (randn(1, 6, 8, seed=1),)),
}


@pytest.mark.parametrize("name", FOLDED)
def test_folded_program_is_bit_identical_to_the_unfolded_one(name):
    make, inputs, fresh = FOLDED[name]
    prog = pipeline.lower(seeded(make()), inputs)
    before = unfolded(seeded(make()), inputs)
    assert len(prog.step_labels) < len(before.step_labels)
    assert len(prog.buffer) <= len(before.buffer)  # a transposed weight replaces the weight
    for args in (inputs, fresh, inputs):
        assert_bit_identical(prog(*args), before(*args))


def test_linear_weights_are_transposed_at_export():
    x = randn(2, 10, 32)
    prog = pipeline.lower(seeded(Block()), (x,))
    before = unfolded(seeded(Block()), (x,))
    # qkv, proj and the MLP's two linears: their transposes are constants of the file now.
    assert prog.step_labels.count(PERMUTE) == before.step_labels.count(PERMUTE) - 4
    assert steps_run(before, x)[PERMUTE] - steps_run(prog, x)[PERMUTE] == 4


def test_dynamic_program_folds_and_stays_identical_at_every_length():
    tokens = lambda t, seed: torch.randint(0, 50, (2, t), generator=torch.Generator().manual_seed(seed))  # noqa: E731
    shapes = ({1: Dim("seq", min=2, max=64)},)
    prog = pipeline.lower(seeded(Decoder()), (tokens(8, 0),), shapes)
    before = unfolded(seeded(Decoder()), (tokens(8, 0),), shapes)
    assert len(prog.step_labels) < len(before.step_labels)
    for t in (3, 37, 8):
        assert_bit_identical(prog(tokens(t, t)), before(tokens(t, t)))


class ConstantNorms(nn.Module):
    """LayerNorms of parameters alone: their inputs are constants, yet each stays a LayerNorm,
    the float32 one a delegate call, the float64 one (refused) a CPU kernel coverage counts."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(randn(4, 8, seed=2))
        self.norm, self.norm64 = nn.LayerNorm(8), nn.LayerNorm(8).double()

    def forward(self, x):
        return x + self.norm(self.table) + self.norm64(self.table.double()).float()


def test_layer_norms_of_constants_are_not_folded():
    x = randn(4, 8)
    prog = pipeline.lower(seeded(ConstantNorms()), (x,))
    cov = prog.coverage
    assert (cov.total, cov.delegated) == (2, 1) and "torch.float64" in cov.not_delegated[0][1]
    assert [s.delegated for s in prog.layer_norm_sites] == [True, False]
    assert steps_run(prog, x)["delegate"] == 1
    dispatches = stats()["dispatches"]
    prog(x)
    assert stats()["dispatches"] > dispatches


class Noise(nn.Module):
    """Random draws read no tensor at all, yet must be drawn on every call."""

    def forward(self, x):
        return x + torch.rand(4)


def test_random_draws_are_not_folded():
    x = torch.zeros(4)
    prog = pipeline.lower(Noise(), (x,))
    assert any("rand" in label for label in prog.step_labels)
    assert not torch.equal(prog(x), prog(x))


def test_timings_cover_every_step_of_the_call(block_program):
    x = randn(2, 10, 32)
    timings: list[tuple[str, float]] = []
    assert_bit_identical(block_program(x, timings=timings), block_program(x))
    assert [label for label, _ in timings] == list(block_program.step_labels)
    assert all(seconds >= 0 for _, seconds in timings)
