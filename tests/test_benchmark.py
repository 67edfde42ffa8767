"""The benchmark: a tool beside the runtime that uses only its public names and no ExecuTorch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline import benchmark

SOURCE = Path(benchmark.__file__)


def test_benchmark_lives_outside_the_runtime_and_uses_no_private_runtime_names():
    assert SOURCE.parent.name == "pipeline"
    tree = ast.parse(SOURCE.read_text())
    imported = [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names]
    private = [f"{module}.{name}" for module, name in imported
               if module and module.startswith("pipeline.runtime") and name.startswith("_")]
    assert not private, private


def test_benchmark_imports_without_executorch_or_transformers():
    code = (
        "import sys, pipeline.benchmark; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('executorch', 'transformers', 'torchao')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parse_shapes():
    assert benchmark.parse_shapes("2x8,model")[:1] == [(2, 8)]
    with pytest.raises(ValueError, match="not ROWSxWIDTH"):
        benchmark.parse_shapes("8")
    with pytest.raises(ValueError, match="positive"):
        benchmark.parse_shapes("0x8")


@pytest.mark.usefixtures("gpu_info")
def test_a_small_benchmark_runs(monkeypatch):
    monkeypatch.setattr(benchmark, "ROTATE_BYTES", 1 << 16)
    result = benchmark.run_benchmark([(16, 128)], repeats=2, progress=lambda line: None)
    (row,) = result["results"]
    assert row["rows"] == 16 and row["width"] == 128 and row["wgpu_us"] > 0 and row["torch_us"] > 0


@pytest.mark.usefixtures("gpu_info")
def test_rounds_interleave_kernel_and_copy_and_report_their_medians(monkeypatch):
    monkeypatch.setattr(benchmark, "ROTATE_BYTES", 1 << 16)
    order = []
    kernel_us, copy_us = iter([4.0, 2.0, 3.0]), iter([2.0, 1.9, 2.85])
    monkeypatch.setattr(benchmark, "time_kernel",
                        lambda *a, **k: order.append("kernel") or ([(next(kernel_us), 9.0)], "gpu-timestamps"))
    monkeypatch.setattr(benchmark, "time_copy", lambda *a, **k: order.append("copy") or next(copy_us))
    result = benchmark.run_benchmark([(16, 128)], repeats=2, progress=lambda line: None, rounds=3)
    assert order == ["kernel", "copy", "copy", "kernel", "kernel", "copy"]
    (row,) = result["results"]
    assert result["rounds"] == 3 and row["wgpu_rounds_us"] == [4.0, 2.0, 3.0]
    assert row["wgpu_us"] == 3.0 and row["wgsl_copy_us"] == 2.0 and row["wgpu_isolated_us"] == 9.0
    # The median of the rounds' ratios (0.5, 0.95, 0.95), not the ratio of the medians (0.667).
    assert row["copy_over_kernel"] == 0.95
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        benchmark.run_benchmark([(16, 128)], rounds=0)


@pytest.mark.usefixtures("gpu_info")
@pytest.mark.parametrize("outputs", benchmark.OUTPUTS)
def test_kernel_and_copy_time_with_rotating_or_shared_outputs(monkeypatch, outputs):
    monkeypatch.setattr(benchmark, "ROTATE_BYTES", 1 << 16)
    result = benchmark.run_benchmark([(16, 128)], repeats=2, progress=lambda line: None, outputs=outputs)
    assert result["outputs"] == outputs and result["results"][0]["wgpu_us"] > 0
    ((batched, _),), _ = benchmark.time_kernel(16, 128, repeats=2, outputs=outputs)
    assert batched > 0 and benchmark.time_copy(16, 128, repeats=2, outputs=outputs) > 0


@pytest.mark.usefixtures("gpu_info")
@pytest.mark.parametrize("stats", [False, True])
def test_the_kernel_is_timed_as_the_runtime_launches_it(monkeypatch, stats):
    # The launch's rows and whether mean and rstd are stored both reach the configuration.
    from pipeline.runtime.device import gpu
    from pipeline.runtime.launch import device_config
    from pipeline.wgsl.config import WIDE_LAUNCH_THREADS

    timed = []
    real = benchmark.compile_pipeline
    monkeypatch.setattr(benchmark, "compile_pipeline", lambda g, config: timed.append(config) or real(g, config))
    monkeypatch.setattr(benchmark, "ROTATE_BYTES", 1 << 16)
    rows = WIDE_LAUNCH_THREADS // device_config(gpu(), 128, True, True).threads_per_row
    benchmark.time_kernel(rows, 128, repeats=2, stats=stats)
    assert timed == [device_config(gpu(), 128, True, True, rows=rows, write_stats=stats)]
    assert timed[0].threads_per_row == 2 * device_config(gpu(), 128, True, True).threads_per_row
    assert timed[0].write_stats is stats


def test_unknown_outputs_mode_is_refused():
    with pytest.raises(ValueError, match="outputs must be one of rotating, shared"):
        benchmark.run_benchmark([(16, 128)], outputs="fresh")
    with pytest.raises(ValueError, match="outputs must be one of"):
        benchmark.time_copy(16, 128, outputs="fresh")


@pytest.mark.usefixtures("gpu_info")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_small_half_benchmark_runs_and_counts_two_bytes_a_value(monkeypatch, dtype):
    monkeypatch.setattr(benchmark, "ROTATE_BYTES", 1 << 16)
    result = benchmark.run_benchmark([(16, 128), (5, 7)], repeats=2, progress=lambda line: None, dtype=dtype)
    assert result["dtype"] == dtype
    row = result["results"][0]
    assert row["mbytes"] == round(16 * 128 * 2 / 1e6, 2) and row["wgpu_us"] > 0 and row["torch_us"] > 0
    assert row["wgpu_gbps"] == round(benchmark.effective_gbps(16, 128, row["wgpu_us"], 2), 1)
    # Without CUDA there is no compiled column to time; on CUDA every row has one.
    assert all((r["compiled_us"] is None) != torch.cuda.is_available() for r in result["results"])


def test_compiled_layer_norm_is_compiled_and_warmed_before_timing():
    # What the CUDA column times, run here on the CPU: torch.compile's default mode.
    x, w, b = torch.randn(8, 24), torch.randn(24), torch.randn(24)
    fn = benchmark.compiled_layer_norm(x, 24, w, b)
    torch.testing.assert_close(fn(x, (24,), w, b), torch.nn.functional.layer_norm(x, (24,), w, b))
