"""The evaluator: dispatcher counting, graph walk, metrics, reports, and a broken delegate caught."""

from __future__ import annotations

import base64
import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline.runtime import delegate
from pipeline.evaluation import audit_coverage, compare, evaluate_accuracy, flatten_output, run_eager
from pipeline.evaluation.graph import origin
from pipeline.evaluation.layer_norm_input import row_stats
from pipeline.evaluation.render import accuracy_html, accuracy_markdown
from pipeline.evaluation.report import write_report
from pipeline.evaluation.runner import accuracy_for


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(2, 4)
        self.unused = nn.LayerNorm(8)

    def forward(self, x, y):
        h = F.layer_norm(self.ln(x), (8,), eps=1e-6)
        return h, self.gn(y)


def test_dispatcher_counts_functional_calls_and_group_norm_not_uncalled_modules():
    run = run_eager(Counted(), (torch.randn(2, 3, 8), torch.randn(2, 4, 5)))
    assert [(c.op, c.module_path) for c in run.calls] == [
        ("layer_norm", "ln"),
        ("layer_norm", ""),  # F.layer_norm in the root's forward
        ("group_norm", "gn"),
    ]


def test_group_norm_reference_is_the_pre_affine_normalization():
    m = Counted()
    nn.init.normal_(m.gn.weight)
    y = torch.randn(2, 4, 5)
    call = run_eager(m, (torch.randn(2, 3, 8), y)).calls[2]
    expected = F.group_norm(y, 2, eps=m.gn.eps).reshape(2, 2, 10)
    torch.testing.assert_close(call.reference, expected)


def test_metrics_against_hand_computed_values():
    m = compare(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 2.0]))
    assert m["max_abs"] == 1.0
    assert m["rel_l2"] == pytest.approx(1 / 3)
    assert m["cosine"] == pytest.approx(11 / (3 * math.sqrt(14)))
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(9))
    same = compare(torch.ones(4), torch.ones(4))
    assert (same["max_abs"], same["cosine"], same["sqnr_db"]) == (0.0, 1.0, math.inf)
    assert compare(torch.tensor([math.nan]), torch.tensor([1.0]))["finite"] is False
    with pytest.raises(ValueError, match="elements"):
        compare(torch.ones(3), torch.ones(4))


def test_flatten_output_takes_floating_leaves_only():
    out = flatten_output({"a": torch.ones(2), "b": (torch.zeros(1, 2), torch.arange(3))})
    assert out.tolist() == [1.0, 1.0, 0.0, 0.0] and out.dtype == torch.float64


def test_origin_recognises_a_reframed_group_norm():
    graph = torch.fx.Graph()
    node = graph.call_function(torch.ops.aten.native_layer_norm.default, ())
    assert origin(node) == "layer_norm"
    node.meta["original_aten"] = torch.ops.aten.native_group_norm.default
    assert origin(node) == "group_norm"


class Blocks(nn.Module):
    """Affine, weight-only and weight-less LayerNorms; eps=0.1 makes a dropped eps visible."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32, eps=0.1)
        self.layers = nn.ModuleList([nn.LayerNorm(32, bias=False), nn.LayerNorm(32, elementwise_affine=False)])
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.2)
            self.norm.bias.normal_(0.0, 0.2)

    def forward(self, x):
        h = self.norm(self.proj(x))
        for layer in self.layers:
            h = layer(torch.tanh(h) * 3.0)
        return self.proj(h)


class Mixed(nn.Module):
    """A float32 LayerNorm and a float64 one, which the partitioner must refuse."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.ln64 = nn.LayerNorm(32).double()

    def forward(self, x):
        return self.ln64(self.ln(x).double()).float()


@pytest.fixture(scope="module")
def blocks():
    module = Blocks().eval()
    inputs = (torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1)) * 4,)
    return module, inputs, pipeline.lower(module, inputs)


def test_coverage_complete_with_per_layer_norm_table(blocks):
    module, inputs, program = blocks
    audit = audit_coverage(module, inputs, program, model="blocks")
    assert audit.complete and (audit.eager_calls, audit.graph_ops, audit.delegated) == (3, 3, 3)
    rows = [(r.module_path, r.input_shape, r.row_width, r.affine, r.origin, r.delegated) for r in audit.layer_norms]
    assert rows == [
        ("norm", [2, 5, 32], 32, "weight+bias", "layer_norm", True),
        ("layers.0", [2, 5, 32], 32, "weight", "layer_norm", True),
        ("layers.1", [2, 5, 32], 32, "none", "layer_norm", True),
    ]


def test_coverage_incomplete_names_the_reason(gpu_info):
    module, inputs = Mixed().eval(), (torch.randn(1, 3, 32),)
    audit = audit_coverage(module, inputs, pipeline.lower(module, inputs))
    assert not audit.complete and (audit.eager_calls, audit.graph_ops, audit.delegated) == (2, 2, 1)
    assert audit.layer_norms[1].module_path == "ln64" and "float32" in audit.layer_norms[1].reason


def test_coverage_incomplete_names_an_eager_call_missing_from_the_graph(gpu_info):
    class WithoutGroupNorm(Counted):
        def forward(self, x, y):
            return F.layer_norm(self.ln(x), (8,), eps=1e-6), y

    counted = Counted().eval()
    pair = (torch.randn(2, 3, 8), torch.randn(2, 4, 5))
    program = pipeline.lower(WithoutGroupNorm().eval(), pair)
    audit = audit_coverage(counted, pair, program)
    assert (audit.eager_calls, audit.graph_ops, audit.delegated) == (3, 2, 2)
    assert audit.missing_from_graph == ["gn (group_norm)"] and not audit.complete


def test_coverage_counts_a_reframed_group_norm(gpu_info):
    counted = Counted().eval()
    pair = (torch.randn(2, 3, 8), torch.randn(2, 4, 5))
    audit = audit_coverage(counted, pair, pipeline.lower(counted, pair))
    assert audit.complete and (audit.eager_calls, audit.graph_ops, audit.delegated) == (3, 3, 3)
    assert [r.origin for r in audit.layer_norms].count("group_norm") == 1


def test_accuracy_passes_and_names_the_worst_layer_norm(gpu_info, blocks):
    report = evaluate_accuracy(*blocks, model="blocks")
    assert report.passed, report.as_dict()["accuracy"]
    assert [e.module_path for e in report.layer_norms] == ["norm", "layers.0", "layers.1"]
    assert all(e.delegated_vs_fp64 is not None and e.delegated_vs_fp64 < 1e-4 for e in report.layer_norms)
    assert report.worst_layer_norm is not None


def drop_eps(monkeypatch) -> None:
    """Break the kernel the delegates call: they launch it from Python, eps dropped."""
    real = delegate.native_layer_norm
    monkeypatch.setattr(delegate, "native_layer_norm",
                        lambda x, shape, w=None, b=None, eps=1e-5, **options: real(x, shape, w, b, 0.0, **options))
    call = delegate.LayerNormDelegate.__call__

    def from_python(self, *args):
        native, self._native = self._native, None
        try:
            return call(self, *args)
        finally:
            self._native = native

    monkeypatch.setattr(delegate.LayerNormDelegate, "__call__", from_python)


def test_a_delegate_with_eps_dropped_fails_the_verdict(gpu_info, blocks, monkeypatch):
    drop_eps(monkeypatch)
    report = evaluate_accuracy(*blocks, model="blocks")
    assert not report.passed
    assert report.worst_layer_norm.module_path == "norm"  # the only LayerNorm with a large eps
    # On its own input the kernel's error is far past eager's: no upstream difference hides it.
    same = report.layer_norms[0].input
    assert same.delegated_vs_fp64 > 1e-3 > 1e-5 > same.eager_fp32_vs_fp64


def test_row_stats_on_crafted_rows():
    spike = torch.zeros(128)
    spike[5] = 64.0  # one element out: |x - mean| / std = sqrt(width - 1), the most possible
    offset = 3.0 + 0.25 * torch.tensor([1.0, -1.0]).repeat(64)  # mean 3, std 0.25: |mean| / std = 12
    constant = torch.full((128,), 0.1)  # std 0: counted, left out of both ratios
    stats = row_stats(torch.stack([offset, spike, constant]), 128)
    assert (stats.rows, stats.width, stats.max_abs) == (3, 128, 64.0)
    assert stats.max_dev_over_std == pytest.approx(math.sqrt(127), rel=1e-12) and stats.outlier_row == 1
    assert stats.max_mean_over_std == pytest.approx(12.0, rel=1e-12)
    assert (stats.min_row_std, stats.constant_rows, stats.nonfinite_rows) == (0.0, 1, 0)
    assert stats.outlier


def test_row_stats_of_constant_and_non_finite_rows_stay_finite():
    flat = row_stats(torch.full((4, 8), -2.5), 8)  # every row constant: no ratio at all
    assert (flat.max_abs, flat.max_dev_over_std, flat.max_mean_over_std, flat.outlier_row) == (2.5, None, None, None)
    assert (flat.min_row_std, flat.constant_rows) == (0.0, 4) and not flat.outlier
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    x[1, 2] = math.inf
    x[2, 0] = math.nan
    stats = row_stats(x, 8)
    assert stats.nonfinite_rows == 2 and stats.outlier_row == 0 and math.isnan(stats.max_abs)
    assert math.isfinite(stats.max_dev_over_std) and math.isfinite(stats.min_row_std)
    assert row_stats(torch.empty(0, 8), 8).rows == 0
    with pytest.raises(ValueError, match="width"):
        row_stats(torch.ones(3, 8), 5)


class Spiky(nn.Module):
    """One LayerNorm whose input rows are an offset row, a spike and a constant row."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ln = nn.LayerNorm(128)
        with torch.no_grad():
            self.ln.weight.normal_(1.0, 0.2)
            self.ln.bias.normal_(0.0, 0.2)

    def forward(self, x):
        return self.ln(x * 1.0) * 2.0


def spiky_inputs() -> tuple[torch.Tensor]:
    x = torch.full((1, 3, 128), 0.1)
    x[0, 0] = 3.0 + 0.25 * torch.tensor([1.0, -1.0]).repeat(64)
    x[0, 1] = 0.0
    x[0, 1, 5] = 64.0
    return (x,)


def test_layer_norm_input_statistics_in_all_three_report_formats(gpu_info, tmp_path):
    module, inputs = Spiky().eval(), spiky_inputs()
    program = pipeline.lower(module, inputs)
    spec = SimpleNamespace(module=module, example_inputs=inputs, name="spiky", variant="tiny", checkpoint=None)
    data = accuracy_for(spec, program, seed=0)
    paths = write_report(tmp_path, "spiky.accuracy", data, accuracy_markdown(data), accuracy_html(data))
    saved = json.loads(paths[0].read_text())
    # The machine's CPU and torch's kernels on it: eager's errors move with them.
    assert "torch's kernels " in saved["environment"]["cpu"]
    assert f"cpu: {saved['environment']['cpu']}" in paths[1].read_text()
    given = saved["layer_norms"][0]["input"]
    stats = given["stats"]
    assert set(stats) == {"rows", "width", "max_abs", "max_dev_over_std", "max_mean_over_std", "min_row_std",
                          "constant_rows", "nonfinite_rows", "outlier_row"}
    assert (stats["rows"], stats["width"], stats["max_abs"], stats["outlier_row"]) == (3, 128, 64.0, 1)
    assert stats["max_dev_over_std"] == pytest.approx(math.sqrt(127))
    assert stats["max_mean_over_std"] == pytest.approx(12.0)
    assert (stats["min_row_std"], stats["constant_rows"]) == (0.0, 1)
    # The kernel on exactly this input, beside eager float32 on it, both against float64.
    for key in ("delegated_vs_fp64", "eager_fp32_vs_fp64", "outlier_row_delegated_vs_fp64",
                "outlier_row_eager_fp32_vs_fp64"):
        assert isinstance(given[key], float) and 0 <= given[key] < 1e-5, key
    assert saved["layer_norm_inputs"] == {
        "outlier_sigmas": 8.0, "outlier_layer_norms": 1, "max_abs": 64.0, "max_abs_at": "ln",
        "max_dev_over_std": stats["max_dev_over_std"], "max_dev_over_std_at": "ln",
        "max_mean_over_std": stats["max_mean_over_std"], "max_mean_over_std_at": "ln"}
    markdown, page = paths[1].read_text(), paths[2].read_text()
    assert "| max |x| |" not in markdown and "max \\|x−mean\\|/std" in markdown
    assert "| **11.3** | **12** |" in markdown  # both ratios past 8 std, marked
    assert page.count("<td class=flag>") == 2 and "<td class=flag>11.3</td>" in page
    assert "LayerNorm inputs: max |x| 64 (ln)" in markdown and "LayerNorm inputs: max |x| 64 (ln)" in page


def test_report_files_hold_the_keys_and_an_embedded_png(gpu_info, blocks, tmp_path):
    module, inputs, program = blocks
    spec = SimpleNamespace(module=module, example_inputs=inputs, name="blocks", variant="tiny", checkpoint=None)
    data = accuracy_for(spec, program, seed=0)
    paths = write_report(tmp_path, "blocks-tiny.accuracy", data, "# md\n", accuracy_html(data))
    saved = json.loads(paths[0].read_text())
    assert {"model", "variant", "adapter", "coverage", "accuracy"} <= saved.keys()
    assert {"eager_calls", "graph_ops", "delegated"} <= saved["coverage"].keys()
    assert {"delegated_vs_fp64_max_abs", "eager_fp32_vs_fp64_max_abs", "cosine", "sqnr_db",
            "worst_layer_norm"} <= saved["accuracy"].keys()
    page = paths[2].read_text()
    encoded = page.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(encoded).startswith(b"\x89PNG\r\n\x1a\n")
    assert "http" not in page  # self-contained


def test_run_reports_writes_files_and_exits_1_on_a_failed_verdict(gpu_info, blocks, tmp_path, monkeypatch):
    from pipeline.evaluation import runner

    module, inputs, program = blocks
    spec = SimpleNamespace(module=module, example_inputs=inputs, name="bart", variant="tiny", checkpoint=None)
    monkeypatch.setattr(runner, "_build_and_lower", lambda name, variant, seed, dtype, checkpoint, audio: (spec, program))
    assert runner.run_reports("coverage", "bart", output_dir=tmp_path, progress=lambda line: None) == 0
    drop_eps(monkeypatch)
    assert runner.run_reports("accuracy", "bart", output_dir=tmp_path, progress=lambda line: None) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"bart-tiny.{kind}.{ext}" for kind in ("accuracy", "coverage") for ext in ("html", "json", "md")
    ]
    assert json.loads((tmp_path / "bart-tiny.accuracy.json").read_text())["verdict"] == "fail"


def test_the_accuracy_report_with_coverage_writes_the_coverage_audit_of_its_own_run(gpu_info, blocks, tmp_path,
                                                                                     monkeypatch):
    from pipeline.evaluation import runner

    module, inputs, program = blocks
    spec = SimpleNamespace(module=module, example_inputs=inputs, name="bart", variant="tiny", checkpoint=None)
    monkeypatch.setattr(runner, "_build_and_lower", lambda name, variant, seed, dtype, checkpoint, audio: (spec, program))
    alone, together = tmp_path / "alone", tmp_path / "together"
    assert runner.run_reports("coverage", "bart", output_dir=alone, progress=lambda line: None) == 0
    assert runner.run_reports("accuracy", "bart", output_dir=together, progress=lambda line: None,
                              with_coverage=True) == 0
    assert sorted(p.name for p in together.iterdir()) == [
        f"bart-tiny.{kind}.{ext}" for kind in ("accuracy", "coverage") for ext in ("html", "json", "md")
    ]
    audit = json.loads((together / "bart-tiny.coverage.json").read_text())
    assert audit["verdict"] == "complete"
    assert audit == json.loads((alone / "bart-tiny.coverage.json").read_text())
    with pytest.raises(ValueError, match="with_coverage"):
        runner.run_reports("coverage", "bart", output_dir=together, with_coverage=True)


def test_the_accuracy_report_of_a_file_with_coverage_writes_the_file_s_coverage_audit(exported, tmp_path, capsys):
    # What coverage_audit.py --pte FILE writes, from the accuracy report's own run of the file.
    from pipeline.evaluation.runner import report_main

    pte = exported("whisper").summary["pte"]
    alone, together = tmp_path / "alone", tmp_path / "together"
    assert report_main("coverage", "report", ["--pte", pte, "--output-dir", str(alone)]) == 0
    assert report_main("accuracy", "report", ["--pte", pte, "--with-coverage", "--output-dir", str(together)]) == 0
    stem = pte.rsplit("/", 1)[-1]
    assert sorted(p.name for p in together.iterdir()) == [
        f"{stem}.{kind}.{ext}" for kind in ("accuracy", "coverage") for ext in ("html", "json", "md")]
    audit = json.loads((together / f"{stem}.coverage.json").read_text())
    assert audit["verdict"] == "complete" and audit["program"]["source"] == "file"
    assert audit == json.loads((alone / f"{stem}.coverage.json").read_text())
    with pytest.raises(SystemExit) as info:
        report_main("accuracy", "report", ["--pte", pte, "--with-coverage", "--runtime", "executorch"])
    assert info.value.code == 2 and "not with --runtime executorch" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["coverage", "accuracy"])
def test_scripts_exit_2_on_bad_usage(kind, capsys):
    # The command line of coverage_audit.py and accuracy_report.py, in this process (the scripts
    # themselves run as processes in test_file_hardening's report piped into head).
    from pipeline.evaluation.runner import report_main

    with pytest.raises(SystemExit) as info:
        report_main(kind, "report", ["llama"])
    assert info.value.code == 2
    assert "invalid choice: 'llama'" in capsys.readouterr().err


class UnusedNorm(nn.Module):
    """One LayerNorm whose output nothing uses (pegasus_x, lilt): lowering removes it."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused, self.proj = nn.LayerNorm(8), nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        self.proj(self.unused(x))
        return self.used(x)


def test_a_norm_removed_as_dead_code_is_reported_dead_not_missed():
    module, inputs = UnusedNorm().eval(), (torch.randn(2, 8),)
    prog = pipeline.lower(module, inputs)
    assert (prog.coverage.total, prog.coverage.delegated, prog.coverage.not_delegated) == (1, 1, [])
    assert [path for _, path in prog.coverage.dead] == ["unused"]
    audit = audit_coverage(module, inputs, prog).as_dict()
    assert audit["verdict"] == "complete", audit
    assert (audit["missing_from_graph"], audit["dead_code"]) == ([], ["unused (layer_norm)"])
    assert audit["coverage"]["eager_calls"] == 1


class EveryKind(nn.Module):
    """A LayerNorm, an RMSNorm, a LayerNorm written by hand, and a chain that looks like an
    RMSNorm but adds eps after the root (a near miss, left on the CPU)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.ln, self.rms = nn.LayerNorm(width), nn.RMSNorm(width)
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        hand = (x - mean) * torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight
        near = x * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + 1e-6)
        return self.ln(x) + self.rms(x) + hand, near


def test_coverage_counts_every_kind_and_lists_a_norm_like_chain_left_on_the_cpu(gpu_info, tmp_path):
    module, inputs = EveryKind().eval(), (torch.randn(2, 3, 16),)
    program = pipeline.lower(module, inputs)
    audit = audit_coverage(module, inputs, program).as_dict()
    assert audit["coverage"]["by_kind"] == {
        "LayerNorm": {"eager": 1, "graph": 1, "delegated": 1},
        "RMSNorm": {"eager": None, "graph": 1, "delegated": 1},
        "hand-written LayerNorm": {"eager": None, "graph": 1, "delegated": 1},
    }
    [chain] = audit["norm_like"]
    assert "eps is not added" in chain and audit["verdict"] != "complete", audit
    # Read back from its file, the program still tells its RMSNorm from its LayerNorms.
    program.save(tmp_path / "kinds.pte")
    loaded = pipeline.load(tmp_path / "kinds.pte")
    assert loaded.coverage.kinds == {"LayerNorm": {"total": 2, "delegated": 2}, "RMSNorm": {"total": 1, "delegated": 1}}
    origins = [r["origin"] for r in audit_coverage(module, inputs, loaded).as_dict()["layer_norms"]]
    assert sorted(origins) == ["layer_norm", "layer_norm", "rms_norm"]
