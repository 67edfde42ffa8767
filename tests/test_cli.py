import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.scripts import SCRIPTS, load_script, run_script, script_env

SCRIPT = SCRIPTS / "export_model.py"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_script("export_model", *args)


@pytest.fixture(scope="module")
def cli():
    """The script's module, for in-process calls of main(argv)."""
    return load_script("export_model")


def test_unknown_model_exits_2_with_usage(cli, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["nosuchmodel"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith("usage:") and "invalid choice: 'nosuchmodel'" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["bart", "--variant", "tiny"], "invalid choice for bart: 'tiny'"), (["whisper", "--dynamic"], "no dynamic dimension")],
)
def test_bad_usage_exits_2(cli, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_bad_checkpoint_exits_1_with_one_line(cli, capsys, tmp_path):
    broken = tmp_path / "ckpt"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "whisper"}')
    assert cli.main(["bart", "--checkpoint", str(broken), "--output-dir", str(tmp_path / "out")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("export_model: ") and str(broken) in last and "'whisper'" in last
    assert not (tmp_path / "out").exists()


def _check_artifacts(out_dir: Path, stem: str, layer_norms: int) -> dict:
    coverage = json.loads((out_dir / f"{stem}.coverage.json").read_text())
    pte = out_dir / f"{stem}.pte"
    assert coverage["layer_norm_ops"] == coverage["delegated"] == layer_norms
    assert coverage["not_delegated"] == []
    assert coverage["pte_bytes"] == pte.stat().st_size > 0
    assert coverage["export_seconds"] > 0
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([pte.name, f"{stem}.coverage.json"])
    return coverage


@pytest.mark.slow
def test_export_whisper_tiny(tmp_path):
    result = run_cli("whisper", "--variant", "tiny", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    coverage = _check_artifacts(tmp_path, "whisper-tiny", 9)
    assert (coverage["model"], coverage["variant"]) == ("whisper", "tiny")


@pytest.mark.parametrize(("name", "layer_norms", "extra"),
                         [("bart", 7, ["--dynamic"]), ("florence2", 21, []), ("whisper", 5, [])])
def test_export_from_checkpoint(checkpoints, exported, name, layer_norms, extra):
    export = exported(name, dynamic="--dynamic" in extra)  # main() returned 0
    stem = f"{name}-custom" + ("-dynamic" if "--dynamic" in extra else "")
    coverage = _check_artifacts(export.out, stem, layer_norms)
    assert coverage["checkpoint"] == str(checkpoints[name][0])
    assert coverage["dynamic"] == ("--dynamic" in extra)
    assert f"{layer_norms}/{layer_norms} norms delegated (LayerNorm {layer_norms}/{layer_norms})" in export.stdout
    # Progress goes to stderr (test_pte's SIGTERM test waits for "lowering" there, from a process).
    assert "lowering" not in export.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer_norms"), [("bart", 19), ("florence2", 53), ("whisper", 13)])
def test_export_default_variant(tmp_path, name, layer_norms):
    result = run_cli(name, "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    _check_artifacts(tmp_path, f"{name}-base", layer_norms)


def exits_2_before_work(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["whisper", "--seed=-1"], "seed must be from 0 to 2**64 - 1, got -1"),
        (["whisper", "--seed=18446744073709551616"], "seed must be from 0 to 2**64 - 1"),
        (["whisper", "--seed=x"], "not an integer"),
        (["whisper", "--output-dir", "{file}"], "is not a directory"),
        (["whisper", "--output-dir", "{file}/sub"], "is not a directory"),
    ],
)
def test_export_bad_seed_and_output_dir_exit_2(cli, capsys, monkeypatch, tmp_path, argv, message):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(cli, "export_model", lambda *a, **k: pytest.fail("exported despite bad usage"))
    argv = [a.format(file=tmp_path / "file") for a in argv]
    assert message in exits_2_before_work(cli.main, argv, capsys)


@pytest.mark.parametrize("kind", ["coverage", "accuracy"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["whisper", "--variant", "huge"], "invalid choice for whisper: 'huge'"),
        (["all", "--variant", "tiny"], "invalid choice for bart: 'tiny'"),
        (["bart", "--seed=-1"], "seed must be from 0"),
        (["bart", "--output-dir", "{file}/reports"], "is not a directory"),
    ],
)
def test_report_bad_usage_exits_2_before_work(kind, argv, message, capsys, monkeypatch, tmp_path):
    from pipeline.evaluation import runner

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(runner, "run_reports", lambda *a, **k: pytest.fail("ran despite bad usage"))
    argv = [a.format(file=tmp_path / "file") for a in argv]
    assert message in exits_2_before_work(lambda a: runner.report_main(kind, "doc", a), argv, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "must be at least 1, got 0"),
        (["--repeats", "-3"], "must be at least 1, got -3"),
        (["--shapes", "99999999999999999999x8"], "rows must be at most 4294967295"),
        (["--shapes", "8x1073741824"], "width at most 1073741823"),
        (["--json", "{file}/b.json"], "is not a directory"),
        (["--json", "{dir}"], "is a directory"),
        (["--ort", "--dtype", "bfloat16"], "takes float32 or float16, not bfloat16"),
    ],
)
def test_bench_bad_usage_exits_2_before_benchmarking(argv, message, capsys, monkeypatch, tmp_path):
    bench = load_script("bench_layer_norm")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(bench, "run_benchmark", lambda *a, **k: pytest.fail("benchmarked despite bad usage"))
    argv = [a.format(file=tmp_path / "file", dir=tmp_path) for a in argv]
    assert message in exits_2_before_work(bench.main, argv, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["x.pte", "--etdump", "a.etdp"], "needs --runtime executorch"),
        (["x.pte", "--runtime", "executorch", "--etdump", "{file}/a.etdp"], "is not a directory"),
        (["x.pte", "--runtime", "executorch", "--etdump", "{dir}"], "is a directory"),
    ],
)
def test_run_pte_etdump_bad_usage_exits_2_before_running(argv, message, capsys, monkeypatch, tmp_path):
    import pipeline.evaluation.artifact

    run_pte = load_script("run_pte")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(pipeline.evaluation.artifact, "run_artifact", lambda *a, **k: pytest.fail("ran despite bad usage"))
    argv = [a.format(file=tmp_path / "file", dir=tmp_path) for a in argv]
    assert message in exits_2_before_work(run_pte.main, argv, capsys)


def test_accuracy_report_executorch_runtime_needs_a_file(capsys, monkeypatch):
    from pipeline.evaluation import runner

    monkeypatch.setattr(runner, "run_reports", lambda *a, **k: pytest.fail("ran despite bad usage"))
    argv = ["whisper", "--runtime", "executorch"]
    assert "executorch needs --pte FILE" in exits_2_before_work(lambda a: runner.report_main("accuracy", "doc", a),
                                                                argv, capsys)
    # The coverage audit runs no program: it takes no --runtime.
    assert "unrecognized arguments" in exits_2_before_work(lambda a: runner.report_main("coverage", "doc", a),
                                                           argv, capsys)


def test_plot_output_path_is_checked_first(capsys, tmp_path):
    plot = load_script("plot_bench")
    (tmp_path / "file").write_text("")
    argv = [str(tmp_path / "missing.json"), str(tmp_path / "file" / "plot.png")]
    assert "is not a directory" in exits_2_before_work(plot.main, argv, capsys)


def test_plot_refuses_results_that_are_special_or_too_large_without_waiting(capsys, tmp_path):
    # Before: a named pipe as the results file hung plot_bench, and /dev/zero was read without end.
    import os

    from support.waits import within

    plot = load_script("plot_bench")
    fifo, large = tmp_path / "fifo.json", tmp_path / "large.json"
    os.mkfifo(fifo)
    with open(large, "wb") as f:
        f.truncate(plot.RESULTS_MAX_BYTES + 1)
    for path, why in ((fifo, "a named pipe"), ("/dev/zero", "a character device"),
                      (large, f"Larger than {plot.RESULTS_MAX_BYTES} bytes")):
        with within(20):
            assert plot.main([str(path), str(tmp_path / "a.png")]) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"cannot read {path}" in err and why in err, err
    assert not (tmp_path / "a.png").exists()


def test_plot_host_path_needs_the_host_path_columns(capsys, tmp_path):
    import json

    plot = load_script("plot_bench")
    row = {"rows": 64, "width": 768, "wgpu_us": 3.0, "wgpu_gbps": 1.0, "torch_gbps": 1.0}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"results": [row]}))
    assert plot.main(["--host-path", str(plain), str(tmp_path / "a.png")]) == 1
    assert "no host-path columns" in capsys.readouterr().err and not (tmp_path / "a.png").exists()
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"results": [{**row, "call_us": 700.0, "layer_norm_us": 750.0,
                                             "cuda_roundtrip_us": None, "torch_cpu_us": 6.0}]}))
    assert plot.main(["--host-path", str(host), str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_scripts_show_only_their_own_lines_unless_verbose():
    quiet = run_cli("whisper", "--variant", "huge")
    lines = [line for line in quiet.stderr.splitlines() if "XDG_RUNTIME_DIR" not in line]
    assert quiet.returncode == 2 and lines[0].startswith("usage:") and "invalid choice" in lines[-1], quiet.stderr
    assert "Failed to load" not in quiet.stderr and "Enum subclass" not in quiet.stderr
    verbose = run_cli("whisper", "--variant", "huge", "--verbose")
    assert verbose.returncode == 2 and "is an Enum subclass" in verbose.stderr


def test_scripts_quiet_the_imports_their_parsers_come_after():
    # These scripts import the evaluation or the census, and with them torchao, before their
    # parser runs: they quiet the dependencies first (accuracy_report as coverage_audit does,
    # the same three lines), and the census's fork server through its preload, imported
    # without the package loading the census's heavy modules.
    names = ("coverage_audit", "census")
    runs = [subprocess.Popen([sys.executable, str(SCRIPTS / f"{name}.py"), "--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=script_env()) for name in names]
    preload = subprocess.run([sys.executable, "-c", "import pipeline.census.preload"], capture_output=True,
                             text=True, env=script_env(), timeout=300)
    for name, run in zip(names, runs):
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0 and out.startswith(f"usage: {name}.py"), err[-2000:]
        assert "Failed to load" not in err and "Enum subclass" not in err, err[-2000:]
    assert preload.returncode == 0 and "Failed to load" not in preload.stderr, preload.stderr[-2000:]


def test_quiet_drops_the_leafspec_warning_only():
    import warnings

    from torch.utils import _pytree

    from pipeline import cli

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.quiet_dependencies()
        _pytree.LeafSpec()
        warnings.warn("a real warning", FutureWarning)
    assert [str(w.message) for w in caught] == ["a real warning"]


def test_scripts_quiet_mesas_runtime_dir_line(tmp_path):
    # Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid or not set" from C when the
    # device is created without it (this CI's lavapipe does).
    env = {k: v for k, v in script_env().items() if k != "XDG_RUNTIME_DIR"}
    result = subprocess.run([sys.executable, str(SCRIPTS / "bench_layer_norm.py"), "--shapes", "8x64",
                             "--repeats", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "XDG_RUNTIME_DIR" not in result.stderr


def test_run_pte_names_a_missing_pte_first(tmp_path, capsys):
    run_pte = load_script("run_pte")
    assert run_pte.main([str(tmp_path / "missing.pte")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"run_pte: FileNotFoundError: {tmp_path}/missing.pte not found"


def test_sigterm_while_export_imports_ends_with_one_line(tmp_path):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, str(SCRIPT), "whisper", "--variant", "tiny", "--output-dir",
                             str(tmp_path)], stderr=subprocess.PIPE, text=True, env=script_env())
    # Still importing on a loaded machine (test_interrupts.py's start-up case); on an idle one
    # (imports about 1 s), main() is building the model, under run()'s handler.
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("export_model: interrupted"), err
    assert list(tmp_path.iterdir()) == []


def _wav_header_only(path: Path, rate: int, channels: int) -> Path:
    """A WAV of 8-bit PCM whose header claims `rate` and `channels`, with 200 bytes of data."""
    import struct

    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels % 2**32, channels, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", 200) + b"\0" * 200
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def _refused_file(tmp_path: Path, case: str) -> tuple[str, list[str], dict[str, str], str]:
    """(script, argv, environment to add, the path its one line must name) of a refusal of a file."""
    import os

    from support.ctranslate2_files import tiny_whisper, write_ct2

    if case == "a rate of 10 MHz":
        wav = _wav_header_only(tmp_path / "fast.wav", 10_000_019, 1)
        return "export_model", ["whisper", "--variant", "tiny", "--audio", str(wav)], {}, str(wav)
    if case == "65,535 channels":
        wav = _wav_header_only(tmp_path / "wide.wav", 16_000, 65_535)
        return "export_model", ["whisper", "--variant", "tiny", "--audio", str(wav)], {}, str(wav)
    if case == "a model.bin that is a named pipe":
        directory = write_ct2(tmp_path / "ct2", tiny_whisper())
        (directory / "model.bin").unlink()
        os.mkfifo(directory / "model.bin")
        return "export_model", ["whisper", "--checkpoint", str(directory)], {}, str(directory)
    table = tmp_path / "layouts.txt"
    os.mkfifo(table)
    return "bench_layer_norm", ["--shapes", "4x8"], {"PIPELINE_LAYOUTS": str(table)}, str(table)


# The layouts table last: its variable stays set in the process for the cases after it.
REFUSALS = ("a rate of 10 MHz", "65,535 channels", "a model.bin that is a named pipe",
            "a layouts table that is a named pipe")


def test_a_refused_file_is_one_line_exit_1_nothing_written_within_1_gb(tmp_path):
    # The promise docs/hardening.md states for every refusal. One process runs each case's
    # main() in turn: its peak, over all of them, bounds each one's own.
    cases = []
    for i, case in enumerate(REFUSALS):
        folder = tmp_path / str(i)
        folder.mkdir()
        script, argv, env, named = _refused_file(folder, case)
        argv += ["--output-dir", str(folder / "out")] if script == "export_model" else []
        cases.append((case, script, argv, env, named, folder))
    plan = json.dumps([[script, argv, env, str(folder / "stderr")] for _, script, argv, env, _, folder in cases])
    peak, codes = tmp_path / "peak", tmp_path / "codes.json"
    status = subprocess.call([sys.executable, "-c", _PEAK_OF_CHILD, str(peak), sys.executable, "-c", _MAINS_IN_TURN,
                              plan, str(codes)], env=script_env(), stdout=subprocess.DEVNULL)
    assert status == 0, "\n".join(path.read_text() for path in sorted(tmp_path.glob("*/stderr")))
    for (case, _, _, _, named, folder), code in zip(cases, json.loads(codes.read_text()), strict=True):
        lines = (folder / "stderr").read_text().splitlines()
        # export_model's progress goes to stderr before the cause.
        causes = [line for line in lines if not line.startswith("[")]
        assert code == 1 and len(causes) == 1 and named in causes[0], (case, code, lines)
        assert not (folder / "out").exists(), case
    kilobytes = int(peak.read_text())
    assert kilobytes * 1024 < 1 << 30, f"peak {kilobytes / 1024:.0f} MB"


# Runs argv[2:] and writes its peak resident kilobytes to argv[1], exiting with its status. A
# process forked from the test's worker would count the worker's memory as its own (Linux keeps
# the high-water mark across exec); forked from this small one, the command's peak is its own.
_PEAK_OF_CHILD = """import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""

# Runs each [script, argv, environment to add, stderr file] of the JSON plan argv[1] by its
# main(argv), stderr (fd 2: C's lines too) in that file, and writes the exit statuses to argv[2].
_MAINS_IN_TURN = f"""import json, os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from support.scripts import load_script
codes = []
for script, argv, env, stderr in json.loads(sys.argv[1]):
    os.environ.update(env)
    sys.stderr.flush()
    with open(stderr, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        codes.append(load_script(script).main(argv))
    except SystemExit as exc:
        codes.append(exc.code)
with open(sys.argv[2], "w") as f:
    json.dump(codes, f)
"""


def test_a_progress_line_and_its_newline_are_one_write():
    # A signal handled between two writes would join the script's "interrupted" line to it.
    from pipeline import cli as pipeline_cli

    class Writes(list):
        write = list.append

        def flush(self):
            self.append("<flush>")

    writes = Writes()
    pipeline_cli.say("[   0.0s] building whisper tiny", writes)
    assert writes == ["[   0.0s] building whisper tiny\n", "<flush>"]
