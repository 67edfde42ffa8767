"""pipeline.lower end to end: every LayerNorm delegated, outputs equal to eager on fresh inputs."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import pipeline
from pipeline.pte import blob
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
