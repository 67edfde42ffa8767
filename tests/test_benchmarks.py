"""The scripts in benchmarks/: each answers --help with its usage and does nothing else, and
each runs end to end on a small case (tiny shapes, a one-layer checkpoint, one repeat) whose
output is read back and checked."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
RESULTS = ROOT / "benchmarks" / "results"

# Each script's small case: its arguments, run from an empty folder of its own ({checkpoints}: a
# folder holding whisper/, a one-layer Whisper checkpoint; {ct2}: a tiny CTranslate2 Whisper directory).
SMALL = {
    # Needs the ctranslate2 package, no dependency of this product: where it is not installed (as
    # in `make test`), what is checked is that the script says so in one line.
    "ctranslate2_parity.py": ["{ct2}", "--batch", "1", "--steps", "3"],
    "executorch_forward_table.py": ["--models", "whisper", "--checkpoints", "{checkpoints}", "--repeats", "1",
                                    "--json", "out.json"],
    "executorch_runtime.py": ["--models", "whisper", "--cpu-backends", "portable", "--repeats", "1",
                              "--checkpoints", "{checkpoints}", "--json", "out.json", "--save", "files"],
    "executorch_verdicts.py": ["--runs", "whisper:portable", "--checkpoints", "{checkpoints}", "--out-dir", "files",
                               "--json", "out.json"],
    # On a result the docs cite: the file's format is what the script reads.
    "fit_launch_cost.py": [str(RESULTS / "h200-tuned" / "h200-wgpu-bench-float32.json")],
    "forward_times.py": ["--models", "whisper", "--checkpoints", "{checkpoints}", "--repeats", "1",
                         "--json", "out.json"],
    "host_path.py": ["--shapes", "16x64"],
    "linear_error_by_k.py": ["--ks", "8", "--rows", "4", "--out-features", "4"],
    "native_call.py": ["--shapes", "16x64", "--json", "out.json"],
    "stats_accuracy.py": ["out.json", "--widths", "96", "--wide-widths", "128"],
    "streamed_rows.py": ["--dtypes", "float32", "--held", "100", "--streamed", "2049"],
}

# Each script run as `python SCRIPT ARGS...` runs it (its folder first on sys.path, its path as
# argv[0]), from a folder of its own, all in one child process: the imports they share (torch,
# ExecuTorch, transformers) load once rather than once a script. The environment is put back
# after each (host_path.py picks the WebGPU implementation through it).
RUN_CODE = """
import contextlib, io, json, os, runpy, sys, traceback
results = []
for script, folder, args in json.loads(sys.argv[1]):
    os.chdir(folder)
    sys.argv, sys.path[0] = [script, *args], os.path.dirname(script)
    environ = dict(os.environ)
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            if isinstance(exc.code, str):  # as the interpreter does: the message on stderr
                print(exc.code, file=sys.stderr)
        except BaseException as exc:
            traceback.print_exc()
            code = repr(exc)
    os.environ.clear()
    os.environ.update(environ)
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(script name, "help" or "small") -> (its folder, what the run did: exit code, stdout, stderr)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    from support.ctranslate2_files import tiny_whisper, write_ct2
    from support.tiny_models import tiny_config

    config = tiny_config("whisper")
    config.encoder_layers = 1
    torch.manual_seed(0)
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    WhisperForConditionalGeneration(config).eval().save_pretrained(checkpoints / "whisper")
    ct2 = write_ct2(tmp_path_factory.mktemp("ct2") / "whisper", tiny_whisper())
    cases = [(script, "help", ["--help"]) for script in SCRIPTS]
    cases += [(ROOT / "benchmarks" / name, "small", [a.format(checkpoints=checkpoints, ct2=ct2) for a in args])
              for name, args in SMALL.items()]
    folders = [tmp_path_factory.mktemp(f"{script.stem}-{kind}") for script, kind, _ in cases]
    # executorch_runtime.py again, on the files its small case saved: as on a host with no transformers.
    saved = dict(zip(((script.name, kind) for script, kind, _ in cases), folders))["executorch_runtime.py", "small"]
    cases.append((ROOT / "benchmarks" / "executorch_runtime.py", "files",
                  ["--files", str(saved / "files"), "--repeats", "1", "--json", "out.json"]))
    folders.append(tmp_path_factory.mktemp("executorch_runtime-files"))
    listed = json.dumps([[str(script), str(folder), args] for (script, _, args), folder in zip(cases, folders)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", RUN_CODE, listed], cwd=tmp_path_factory.mktemp("cwd"), env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.splitlines()[-1])
    return {(script.name, kind): (folder, result) for (script, kind, _), folder, result in zip(cases, folders, results)}


def ran(runs, name: str) -> tuple[Path, str]:
    """The folder and stdout of `name`'s small case, which must have exited 0."""
    folder, result = runs[name, "small"]
    assert result["code"] == 0, result["stderr"][-3000:] or result["code"]
    return folder, result["stdout"]


def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def test_benchmarks_are_found():
    assert SCRIPTS


def test_each_benchmark_has_a_small_case():
    assert {s.name for s in SCRIPTS} == set(SMALL)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_help_prints_usage_and_writes_nothing(script, runs):
    # Run from an empty folder: --help must create no file there (nor measure anything).
    folder, result = runs[script.name, "help"]
    assert result["code"] == 0, result["stderr"][-2000:] or result["code"]
    assert result["stdout"].startswith(f"usage: {script.name}"), result["stdout"][:200]
    assert not list(folder.iterdir())


def test_ctranslate2_parity(runs):
    folder, result = runs["ctranslate2_parity.py", "small"]
    if importlib.util.find_spec("ctranslate2") is None:
        assert result["code"] == 1
        assert result["stderr"].strip().splitlines() == [
            "ctranslate2_parity.py: needs the ctranslate2 package (pip install ctranslate2)"]
        return
    _, stdout = ran(runs, "ctranslate2_parity.py")
    assert "greedy tokens the same for 1 of 1 inputs" in stdout, stdout


def test_executorch_forward_table(runs, native_runtime):
    folder, _ = ran(runs, "executorch_forward_table.py")
    report = json.loads((folder / "out.json").read_text())
    assert report["machine"]["adapter"]
    [row] = report["results"]
    assert (row["model"], row["variant"], row["repeats"]) == ("whisper", "custom", 1)
    assert set(row["seconds"]) == set(row["vs_fp64"]) == set(report["columns"])
    for column in report["columns"]:
        assert finite(row["seconds"][column], *row["all_seconds"][column]) and row["seconds"][column] > 0
        assert row["vs_fp64"][column]["rel_l2"] < 1e-4, (column, row["vs_fp64"][column])


def test_executorch_runtime(runs, native_runtime):
    folder, stdout = ran(runs, "executorch_runtime.py")
    report = json.loads((folder / "out.json").read_text())
    [row] = report["results"]
    assert (row["model"], row["variant"], row["cpu_backend"], row["repeats"]) == ("whisper", "custom", "portable", 1)
    assert finite(row["executorch_seconds"], row["eager_seconds"], row["lower_seconds"])
    assert row["max_abs_vs_eager"] <= 1e-4, row  # the bound its --files runs hold a file to
    assert stdout.startswith("whisper portable: executorch ")
    assert sorted(p.name for p in (folder / "files").iterdir()) == ["whisper-portable.bpte"]


def test_executorch_runtime_files(runs, native_runtime):
    # The saved bundle run without building its model: ExecuTorch's check against eager's outputs,
    # and the outputs against them and the Python runtime's.
    folder, result = runs["executorch_runtime.py", "files"]
    assert result["code"] == 0, result["stderr"][-3000:] or result["code"]
    [row] = json.loads((folder / "out.json").read_text())["results"]
    assert (row["model"], row["cpu_backend"], row["executorch_check"], row["passed"]) == ("whisper", "portable", True, True)
    assert row["max_abs_vs_eager"] <= 1e-4 and row["max_abs_vs_python_runtime"] <= 1e-5, row
    assert result["stdout"].startswith("whisper-portable.bpte: executorch ") and result["stdout"].rstrip().endswith("passed")


def test_executorch_verdicts(runs, native_runtime):
    folder, stdout = ran(runs, "executorch_verdicts.py")
    [row] = json.loads((folder / "out.json").read_text())["results"]
    assert (row["model"], row["variant"], row["cpu_backend"]) == ("whisper", "custom", "portable")
    assert row["passed"], row["verdict"]["why"]
    assert row["verdict"]["layer_norms"]
    assert finite(row["forward_seconds"], row["export_seconds"])
    assert (folder / row["pte"]).is_file()
    assert stdout.startswith("whisper-custom: pass;")


def test_fit_launch_cost(runs):
    _, stdout = ran(runs, "fit_launch_cost.py")
    lines = stdout.splitlines()
    assert [line[:17].strip() for line in lines] == ["WGSL copy", "kernel", "torch copy", "torch layer_norm"]
    for line in lines:
        rate, fixed = re.search(r"rate +(\S+) TB/s +fixed +(\S+) us/launch", line).groups()
        assert float(rate) > 0 and finite(float(fixed)), line


def test_forward_times(runs, gpu_info):
    folder, stdout = ran(runs, "forward_times.py")
    report = json.loads((folder / "out.json").read_text())
    [row] = report["rows"]
    assert (row["model"], row["variant"]) == ("whisper", "custom")
    assert finite(row["eager_s"], row["in_memory_s"], row["loaded_file_s"], row["ratio"], row["load"]["load_s"])
    assert set(row["breakdown_s"]) == {"layer_norm_delegates", "matmuls", "copies", "other_kernels", "interpreter"}
    assert row["breakdown_s"]["layer_norm_delegates"] > 0
    assert row["steps"] > 0 and row["pte_bytes"] > 0
    assert "| whisper-custom | loaded (after) |" in stdout


def test_host_path(runs, native_runtime):
    # The script checks each variant's output against the product's, bit for bit, itself.
    folder, _ = ran(runs, "host_path.py")
    report = json.loads((folder / "host-path-variants-float32.json").read_text())
    assert set(report["devices"]) == {"wgpu", "dawn"}
    [row] = report["results"]
    assert (row["rows"], row["width"]) == (16, 64)
    variants = ("poll_thread", "map_here", "threaded_read", "product", "dawn", "native", "native_block")
    assert all(finite(row[f"{name}_us"]) and row[f"{name}_us"] > 0 for name in variants), row


def test_linear_error_by_k(runs):
    _, stdout = ran(runs, "linear_error_by_k.py")
    rows = [line.split() for line in stdout.splitlines()[1:]]
    assert [(k, run) for k, run, *_ in rows] == [("8", run) for run in ("eager", "portable", "xnnpack")]
    for _, _, rel_l2, _, max_abs, _ in rows:
        assert 0 <= float(rel_l2) < 1e-5 and finite(float(max_abs))


def test_native_call(runs, native_runtime):
    # The script checks each call against torch's LayerNorm itself.
    folder, _ = ran(runs, "native_call.py")
    report = json.loads((folder / "out.json").read_text())
    [row] = report["results"]
    assert (row["rows"], row["width"]) == (16, 64)
    times = [row[k] for k in ("executorch_us", "python_runtime_us", "call_us", "python_launch_us", "torch_cpu_us")]
    assert finite(*times) and min(times) > 0, row


def test_stats_accuracy(runs, gpu_info):
    folder, _ = ran(runs, "stats_accuracy.py")
    report = json.loads((folder / "out.json").read_text())
    assert [row["width"] for row in report["cases"]] == [96] * 3
    assert report["wide_launch"]["widths"] == [128] and len(report["wide_launch"]["cases"]) == 3
    for row in [*report["cases"], *report["summary"], *report["wide_launch"]["cases"],
                *report["wide_launch"]["summary"]]:
        names = ("eager", "held", "streamed") if "streamed" in row else ("eager", "held", "held_wide_launch")
        assert all(finite(*row[name].values()) for name in names), row


def test_streamed_rows(runs, gpu_info):
    _, stdout = ran(runs, "streamed_rows.py")
    lines = stdout.splitlines()
    measured = [line for line in lines if " float32 " in line]
    assert measured and len(measured) % 4 == 0, stdout  # four large-mean cases per reduction path
    for line in measured:
        held, streamed = re.fullmatch(r".*:  held (\S+)  streamed (\S+)", line).groups()
        assert finite(*map(float, held.split("/") + streamed.split("/"))), line
    assert len(lines[lines.index("constant rows (kernel | aten):") + 1:]) == 5


def test_tuned_layouts_sh(tmp_path, gpu_info):
    # One shape tuned in one round, then benchmarked with the table it wrote.
    knobs = {"SHAPES": "16x64", "TUNE_DTYPES": "float32", "ROUNDS": "1", "BENCH_DTYPES": "float32",
             "BENCH_SHAPES": "16x64"}
    env = {**os.environ, **knobs, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # its python3: this one
    run = subprocess.run([str(ROOT / "benchmarks" / "tuned_layouts.sh"), str(tmp_path), "small"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    assert "[1/1] layer_norm float32 16x64: " in (tmp_path / "small-tune.log").read_text()
    # The launch enters the table only where a layout beat the rule's by MIN_GAIN in that round.
    table = (tmp_path / "small.txt").read_text().splitlines()
    entries = [line.split() for line in table if line.startswith("layout ")]
    bench = json.loads((tmp_path / "small-bench-float32.json").read_text())
    assert bench["layouts"] == {"file": str(tmp_path / "small.txt"), "entries": len(entries)}
    [row] = bench["results"]
    assert (row["rows"], row["width"]) == (16, 64)
    assert finite(row["wgpu_us"]) and row["wgpu_us"] > 0
    for layout in entries:
        assert layout[1:3] == ["layer_norm", "float32"] and layout[7:9] == ["64", "16"], layout
        assert row["layout"] == [int(layout[9]), int(layout[10])]  # threads a row, workgroup: the tuned ones


def test_executorch_runtime_files_fail_outputs_off_eager_s(runs, native_runtime, tmp_path, capsys):
    # The same file bundled with eager outputs moved by 1e-3: ExecuTorch's check misses, the run
    # says FAILED and exits 1.
    import torch

    from pipeline.pte import bundle

    spec = importlib.util.spec_from_file_location("executorch_runtime", ROOT / "benchmarks" / "executorch_runtime.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    folder, _ = runs["executorch_runtime.py", "small"]
    saved = bundle.read((folder / "files" / "whisper-portable.bpte").read_bytes())
    (tmp_path / "whisper.pte").write_bytes(saved.program)
    script.write_bundle(tmp_path / "whisper.pte", saved.inputs, [t + 1e-3 for t in saved.expected],
                        tmp_path / "whisper-portable.bpte")
    (tmp_path / "whisper.pte").unlink()
    assert script.main(["--files", str(tmp_path), "--repeats", "1"]) == 1
    said = capsys.readouterr().out.rstrip()
    assert said.endswith("FAILED") and "ExecuTorch's check missed" in said, said
    # Bytes that are no bundle, or a bundle cut short (which crashes ExecuTorch's bundled-program
    # calls): refused in Python, before ExecuTorch sees them.
    import pipeline.native
    from pipeline.pte.file import PteError

    data = (folder / "files" / "whisper-portable.bpte").read_bytes()
    with pytest.raises(PteError, match="not a bundled program"):
        pipeline.native.NativeBundle(b"not a bundled program")
    for cut in (1000, len(data) // 2, len(data) - 100):
        with pytest.raises(PteError, match="damaged bundled program"):
            pipeline.native.NativeBundle(data[:cut], "cut")
    # What makes a difference: NaN where the other has none, and outputs of another shape.
    one = torch.ones(2)
    assert script.max_abs([one], [one + 0.5]) == 0.5
    assert script.max_abs([torch.tensor([float("nan"), 1.0])], [torch.tensor([float("nan"), 1.0])]) == 0
    assert math.isnan(script.max_abs([torch.tensor([float("nan")])], [torch.tensor([1.0])]))
    assert script.max_abs([one], [torch.ones(3)]) == math.inf and script.max_abs([one], [one, one]) == math.inf
