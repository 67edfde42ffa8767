"""What the native backend records in ExecuTorch's runtime (ETDump events, captured delegate
calls) and the verdict of a file run there (pipeline.evaluation.executorch_verdict)."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import pipeline
from pipeline.evaluation import executorch_verdict
from pipeline.aot.lowering import lower_to_edge
from pipeline.pte.file import PteFile


class Block(nn.Module):
    """A LayerNorm, a linear and a weight-less LayerNorm: two WebGPU delegates a forward."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(24)
        self.linear = nn.Linear(24, 40)
        self.plain = nn.LayerNorm(40, elementwise_affine=False)
        with torch.no_grad():
            self.norm.weight.normal_()
            self.norm.bias.normal_()

    def forward(self, x):
        return self.plain(torch.relu(self.linear(self.norm(x))))


@pytest.fixture(scope="module")
def block_files(native_runtime, tmp_path_factory):
    """The block as a portable file and as an XNNPACK file, with its spec and inputs."""
    torch.manual_seed(0)
    model = Block().eval()
    inputs = (torch.randn(2, 7, 24) * 3 + 1,)
    folder = tmp_path_factory.mktemp("trace")
    portable = folder / "block.pte"
    pipeline.lower(model, inputs).save(portable)
    edge, coverage = lower_to_edge(model, inputs, None, "xnnpack")
    assert coverage.complete
    xnnpack = folder / "block-xnnpack.pte"
    xnnpack.write_bytes(edge.to_executorch().buffer)
    spec = types.SimpleNamespace(module=model, example_inputs=inputs, dynamic_shapes=None)
    return spec, portable, xnnpack


def test_etdump_lists_each_layer_norm_delegate_with_its_times(block_files, tmp_path):
    from executorch.devtools import Inspector

    from pipeline.native.trace import TracedProgram, parse_metadata

    from pipeline import runtime

    spec, portable, _ = block_files
    walls = []
    with TracedProgram(portable, etdump=True) as program:
        # The wheel's runtime records no events of its own: the backend opens the blocks.
        assert not program.runtime_records
        for _ in range(3):
            start = time.perf_counter()
            program(*spec.example_inputs)
            walls.append((time.perf_counter() - start) * 1e3)
        path = program.write_etdump(tmp_path / "block.etdp")
    # Where the adapter has timestamp queries an event spans its launches' GPU time, which
    # lies within the forward's wall time; elsewhere the call's wall time, host to host.
    timing = "gpu" if "timestamp-query" in runtime.device_info()["features"] else "wall"
    inspector = Inspector(etdump_path=str(path), delegate_metadata_parser=parse_metadata)
    [block] = inspector.event_blocks
    assert [e.name for e in block.events] == ["native_layer_norm #0", "native_layer_norm #1"]
    for event, width in zip(block.events, (24, 40)):
        assert event.is_delegated_op and len(event.perf_data.raw) == 3 and min(event.perf_data.raw) > 0
        meta = event.delegate_debug_metadatas
        assert meta["rows"] == [14] * 3 and meta["width"] == [width] * 3 and meta["timing"] == [timing] * 3
        assert all(ms < wall for ms, wall in zip(event.perf_data.raw, walls)), (event.perf_data.raw, walls)


def test_no_etdump_without_delegate_calls(block_files, tmp_path):
    from pipeline.native.trace import TracedProgram

    _, portable, _ = block_files
    with TracedProgram(portable, etdump=True) as program, pytest.raises(RuntimeError, match="ETDump is empty"):
        program.write_etdump(tmp_path / "none.etdp")
    assert not (tmp_path / "none.etdp").exists()


def test_captured_calls_are_the_python_runtimes_bit_for_bit(block_files):
    from pipeline.native.trace import TracedProgram, captured_calls

    spec, _, xnnpack = block_files
    with TracedProgram(xnnpack, capture=True) as program:
        program(*spec.example_inputs)
        calls = program.captured_calls()
    assert captured_calls() == []  # closing switched recording off and dropped the copies
    assert [tuple(c[0].shape) for c in calls] == [(2, 7, 24), (2, 7, 40)]
    rows = executorch_verdict.layer_norm_identity(PteFile.read(xnnpack), calls)
    assert [r["identical"] for r in rows] == [True, True] and all(r["max_abs_difference"] == 0 for r in rows)
    # Each call's input as ExecuTorch's runtime gave it, and the kernel's error on exactly that input.
    assert [(r["input"]["stats"]["rows"], r["input"]["stats"]["width"]) for r in rows] == [(14, 24), (14, 40)]
    assert rows[0]["input"]["stats"]["max_abs"] == float(spec.example_inputs[0].abs().max())
    assert all(0 < r["input"]["delegated_vs_fp64"] < 1e-5 and 0 < r["input"]["eager_fp32_vs_fp64"] < 1e-5
               for r in rows)
    page = executorch_verdict.report_html({"model": "block", "variant": "x", "verdict": "pass",
                                           "program": {"pte": "f.pte", "pte_sha256": "0" * 64},
                                           "accuracy": _verdict_of(rows)})
    assert "LayerNorm inputs in ExecuTorch" in page and "max |x−mean|/std" in page
    # One flipped bit in an output is seen.
    out = calls[1][-1]
    out.view(torch.int32).view(-1)[5] ^= 1
    rows = executorch_verdict.layer_norm_identity(PteFile.read(xnnpack), calls)
    assert [r["identical"] for r in rows] == [True, False] and rows[1]["max_abs_difference"] > 0


def test_verdict_holds_the_file_against_its_no_delegate_reference(block_files):
    spec, _, xnnpack = block_files
    verdict = executorch_verdict.evaluate_in_executorch(xnnpack, {"cpu_backend": "xnnpack"}, spec)
    assert verdict["passed"], verdict["why"]
    assert verdict["layer_norms_identical"] and len(verdict["layer_norms"]) == 2
    for key in ("file_vs_fp64", "reference_vs_fp64", "eager_vs_fp64"):
        assert verdict[key]["rel_l2"] > 0 and verdict[key]["max_abs"] > 0
    assert verdict["rel_l2_ratio"] == verdict["file_vs_fp64"]["rel_l2"] / verdict["reference_vs_fp64"]["rel_l2"]
    assert any("eager float32" in line for line in executorch_verdict.verdict_lines(verdict))


def test_verdict_fails_a_file_less_accurate_than_its_reference(block_files, monkeypatch):
    """A reference as exact as float64 allows leaves the file far past 1.1x its error."""
    spec, _, xnnpack = block_files
    with torch.no_grad():
        exact = pipeline.evaluation.run_eager(*pipeline.evaluation.to_float64(spec.module, spec.example_inputs),
                                              keep_tensors=False).outputs
    monkeypatch.setattr(executorch_verdict, "run_in_executorch", lambda buffer, inputs: [exact.float()])
    verdict = executorch_verdict.evaluate_in_executorch(xnnpack, {"cpu_backend": "xnnpack"}, spec)
    assert not verdict["passed"] and "relative L2 error" in verdict["why"] and "max abs error" in verdict["why"]


def test_accuracy_report_in_executorch_runtime_writes_the_verdict(block_files, monkeypatch, tmp_path, capsys):
    import json

    import pipeline.evaluation.artifact
    from pipeline.evaluation import runner

    spec, _, xnnpack = block_files
    summary = {"pte_sha256": "0" * 64, "seed": 0, "cpu_backend": "xnnpack"}
    monkeypatch.setattr(pipeline.evaluation.artifact, "read_artifact_file",
                        lambda pte: (summary, Path(pte).read_bytes()))
    monkeypatch.setattr(pipeline.evaluation.artifact, "build_for_artifact",
                        lambda s, audio=None: types.SimpleNamespace(**vars(spec), name="block", variant="small", checkpoint=None))
    assert runner.run_reports("accuracy", None, output_dir=tmp_path, pte=xnnpack, runtime="executorch") == 0
    data = json.loads((tmp_path / "block-xnnpack.pte.executorch.accuracy.json").read_text())
    assert data["verdict"] == "pass" and data["runtime"] == "executorch"
    assert data["accuracy"]["layer_norms_identical"] and data["accuracy"]["cpu_backend"] == "xnnpack"
    markdown = (tmp_path / "block-xnnpack.pte.executorch.accuracy.md").read_text()
    assert "reference (xnnpack, no WebGPU delegate)" in markdown and "eager float32" in markdown
    assert (tmp_path / "block-xnnpack.pte.executorch.accuracy.html").read_text().startswith("<!DOCTYPE html>")
    assert "rel L2" in capsys.readouterr().out


def _verdict_of(rows: list[dict]) -> dict:
    """A passing verdict around `rows`, enough for the report's pages."""
    errors = {"rel_l2": 1e-7, "max_abs": 1e-6, "cosine": 1.0, "sqnr_db": 140.0, "finite": True}
    return {"rule": "r", "cpu_backend": "xnnpack", "dtype": "float32", "file_vs_fp64": errors,
            "reference_vs_fp64": errors, "eager_vs_fp64": errors, "rel_l2_ratio": 1.0, "max_abs_ratio": 1.0,
            "rel_l2_factor": 1.1, "max_abs_factor": 1.5, "layer_norms": rows, "passed": True, "why": ""}
