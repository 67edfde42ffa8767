"""The benchmark's ORT column (pipeline/benchmark_ort.py): ONNX Runtime's WebGPU provider runs
the one-node LayerNormalization model (on SwiftShader where there is no GPU), its profile says
so, and a run that would happen or happened on ORT's CPU provider is refused."""

import json
import os

import pytest
import torch

from pipeline import benchmark, benchmark_ort
from support.gpu import REQUIRE_GPU_ENV
from support.scripts import load_script

ROWS, WIDTH = 8, 128


def _affine(dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(WIDTH, generator=gen).to(dtype), torch.randn(WIDTH, generator=gen).to(dtype)


@pytest.fixture(scope="module")
def ort_webgpu():
    """onnxruntime with its WebGPU provider and an adapter it accepts; a skip without them (a
    failure under PIPELINE_REQUIRE_GPU=1: set-up installs the bench extra and SwiftShader)."""
    try:
        benchmark_ort.OrtLayerNorm(ROWS, WIDTH, *_affine())
    except RuntimeError as exc:
        if os.environ.get(REQUIRE_GPU_ENV) == "1":
            raise
        pytest.skip(str(exc))
    return benchmark_ort._ort()[1]


def test_the_model_is_one_layer_normalization_node_of_opset_17(ort_webgpu):
    import onnx

    weight, bias = (t.numpy() for t in _affine(torch.float16))
    model = onnx.load_from_string(benchmark_ort.layer_norm_model(ROWS, WIDTH, weight, bias))
    (node,) = model.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "LayerNormalization" and list(node.input) == ["x", "weight", "bias"]
    assert attrs["axis"] == -1 and attrs["epsilon"] == pytest.approx(1e-5)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    with pytest.raises(ValueError, match="weight and bias"):
        benchmark_ort.layer_norm_model(ROWS, WIDTH + 1, weight, bias)


def test_ort_runs_the_layer_norm_on_its_webgpu_provider(ort_webgpu, tmp_path):
    weight, bias = _affine()
    x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(2))
    session = benchmark_ort.OrtLayerNorm(ROWS, WIDTH, weight, bias, profile_dir=tmp_path)
    out = session(x)
    events = session.end_profiling()
    assert not list(tmp_path.iterdir())  # the profile file is read and removed
    nodes = [e for e in events if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    assert [e["args"]["provider"] for e in nodes] == ["WebGpuExecutionProvider"]
    benchmark_ort.check_webgpu_ran(events)
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (WIDTH,), weight, bias), atol=1e-5, rtol=0)


def test_time_ort_reports_the_kernel_from_gpu_timestamps(ort_webgpu):
    times = benchmark_ort.time_ort(ROWS, WIDTH, repeats=2)
    # SwiftShader has timestamp queries: ORT's profiler times each dispatch on the device.
    assert times["ort_kernel_us"] > 0 and times["ort_dispatches"] >= 1 and times["ort_run_us"] > 0


def test_a_forced_cpu_fallback_is_refused(ort_webgpu):
    with pytest.raises(benchmark_ort.OrtFallbackError, match="CPU provider"):
        benchmark_ort.OrtLayerNorm(ROWS, WIDTH, *_affine(), options={"forceCpuNodeNames": benchmark_ort.NODE})


def test_a_profile_of_a_run_on_the_cpu_provider_is_refused(ort_webgpu, tmp_path):
    # The same model run where ORT's fallback is allowed and the node forced onto the CPU.
    so = ort_webgpu.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "cpu")
    so.add_session_config_entry(benchmark_ort.OPTION_PREFIX + "forceCpuNodeNames", benchmark_ort.NODE)
    weight, bias = _affine()
    model = benchmark_ort.layer_norm_model(ROWS, WIDTH, weight.numpy(), bias.numpy())
    session = ort_webgpu.InferenceSession(model, so, providers=[benchmark_ort.PROVIDER, "CPUExecutionProvider"])
    session.run(None, {"x": torch.randn(ROWS, WIDTH).numpy()})
    events = json.loads(open(session.end_profiling()).read())
    with pytest.raises(benchmark_ort.OrtFallbackError, match="layer_norm on CPUExecutionProvider"):
        benchmark_ort.check_webgpu_ran(events)
    with pytest.raises(benchmark_ort.OrtFallbackError, match="no node run"):
        benchmark_ort.check_webgpu_ran([e for e in events if e["cat"] != "Node"])


def test_kernel_times_sum_a_runs_dispatches():
    events = [{"cat": "Api", "name": f"{benchmark_ort.NODE}&LayerNormalization&P{i % 2}", "ts": i, "dur": d}
              for i, d in enumerate([3, 4, 5, 6])]
    assert benchmark_ort.kernel_times(events, runs=2) == ([7.0, 11.0], 2)
    assert benchmark_ort.kernel_times([], runs=2) == ([], 0)
    with pytest.raises(RuntimeError, match="3 GPU events"):
        benchmark_ort.kernel_times(events[:3], runs=2)


@pytest.mark.usefixtures("gpu_info")
def test_the_bench_has_an_ort_column_beside_ours_with_errors_against_float64(ort_webgpu, monkeypatch):
    monkeypatch.setattr(benchmark, "ROTATE_BYTES", 1 << 16)
    monkeypatch.setattr(benchmark, "WARM_SECONDS", 0.01)
    lines = []
    result = benchmark.run_benchmark([(ROWS, WIDTH)], repeats=2, progress=lines.append, host_path=True,
                                     accuracy=True, columns=[benchmark_ort.OrtColumn()])
    (row,) = result["results"]
    assert row["ort_kernel_us"] > 0 and row["ort_run_us"] > 0 and row["call_us"] > 0 and row["wgpu_us"] > 0
    assert result["ort"]["provider"] == "WebGpuExecutionProvider" and "ORT kernel" in lines[0]
    assert set(row["accuracy"]) == set(benchmark.ACCURACY_ROWS)
    for errors in row["accuracy"].values():
        assert {"ours", "torch", "ort"} <= set(errors)
    # ORT computed with the same weight and bias as the reference: right on plain random rows.
    random = row["accuracy"]["random"]
    assert random["ort"]["nonfinite"] == 0 and random["ort"]["max_abs"] < 1e-4
    assert random["ours"]["max_abs"] < 1e-4 and row["accuracy"]["mean_300"]["ours"]["max_abs"] < 1e-3


def test_plot_draws_the_ort_columns_and_the_errors(tmp_path, capsys):
    plot = load_script("plot_bench")
    stats = {"max_abs": 1e-6, "rel_l2": 1e-7, "nonfinite": 0}
    row = {"rows": 64, "width": 768, "wgpu_us": 3.0, "wgpu_gbps": 1.0, "wgpu_isolated_us": 4.0, "torch_gbps": 1.0,
           "call_us": 700.0, "torch_cpu_us": 6.0, "ort_kernel_us": 20.0, "ort_run_us": 1800.0}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"results": [row]}))
    assert plot.main(["--accuracy", str(plain), str(tmp_path / "a.png")]) == 1
    assert "no accuracy columns" in capsys.readouterr().err and not (tmp_path / "a.png").exists()
    accuracy = {kind: {"ours": stats, "ort": {"max_abs": None, "rel_l2": None, "nonfinite": 5}}
                for kind in benchmark.ACCURACY_ROWS}
    full = tmp_path / "full.json"
    full.write_text(json.dumps({"results": [{**row, "accuracy": accuracy}]}))
    for flags, name in (([], "speed.png"), (["--host-path"], "host.png"), (["--accuracy"], "errors.png")):
        assert plot.main([*flags, str(full), str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
