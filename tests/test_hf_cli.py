"""`--hf DIR`: a Hugging Face directory as a user holds it through export_model, run_pte and
the reports, the file rebuilt from its coverage file; and what the commands refuse."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from support.scripts import load_script


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT saved by transformers as users receive one (config.json + model.safetensors)."""
    from pipeline.models.hf import tiny_config
    from transformers import BertModel

    torch.manual_seed(1)
    directory = tmp_path_factory.mktemp("hf") / "my-bert"
    BertModel(tiny_config("bert")).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def exported(bert_dir, tmp_path_factory):
    """export_model.py --hf's main() in this process: (the output folder, what it printed to stderr)."""
    out = tmp_path_factory.mktemp("out")
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = load_script("export_model").main(["--hf", str(bert_dir), "--output-dir", str(out)])
    assert status == 0, stderr.getvalue()
    return out, stderr.getvalue()


def test_export_names_files_after_the_directory_and_records_it(bert_dir, exported):
    out, stderr = exported
    assert sorted(p.name for p in out.iterdir()) == ["my-bert.coverage.json", "my-bert.pte"]
    summary = json.loads((out / "my-bert.coverage.json").read_text())
    assert summary["hf"] == str(bert_dir.resolve()) and summary["model"] == "bert" and summary["variant"] == "hf"
    assert summary["checkpoint_sha256"] and summary["layer_norm_ops"] == summary["delegated"] > 0
    assert "weights from the directory" in stderr


def test_run_pte_rebuilds_the_model_from_the_coverage_file(exported, capsys):
    out, _ = exported
    run_pte = load_script("run_pte")
    for runtime in ("python", "executorch"):
        status = run_pte.main([str(out / "my-bert.pte"), "--runtime", runtime, "--repeats", "1"])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        assert "passed" in captured.out


def test_a_changed_directory_is_refused_when_the_file_is_rebuilt(bert_dir, exported, tmp_path, capsys):
    out, _ = exported
    copied = tmp_path / "copy"
    copied.mkdir()
    for name in ("my-bert.pte", "my-bert.coverage.json"):
        (copied / name).write_bytes((out / name).read_bytes())
    config = bert_dir / "config.json"
    original = config.read_bytes()
    try:
        config.write_bytes(original.replace(b'"layer_norm_eps": 1e-12', b'"layer_norm_eps": 1e-06'))
        status = load_script("run_pte").main([str(copied / "my-bert.pte")])
    finally:
        config.write_bytes(original)
    assert status == 1 and "changed since the export" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_directory_without_weights_says_seeded_random(tmp_path, capsys):
    from pipeline.models.hf import tiny_config

    directory = tmp_path / "no-weights"
    tiny_config("vit").save_pretrained(directory)
    # coverage_audit.py's command line in this process, as the scripts above run.
    assert _report_main("coverage_audit")(["--hf", str(directory), "--output-dir", str(tmp_path / "reports")]) == 0
    assert "seeded random weights" in capsys.readouterr().out
    report = json.loads((tmp_path / "reports" / "no-weights.coverage.json").read_text())
    assert report["weights"] == {"checkpoint": None} and report["verdict"] == "complete"
    assert report["coverage"]["delegated"] > 0


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("export_model", ["bart", "--hf", "x"], "not both"),
    ("export_model", ["--task", "base"], "give a model name or --hf DIR"),
    ("export_model", ["bart", "--inputs", "x.pt"], "only with --hf"),
    ("export_model", ["--hf", "x", "--variant", "base"], "--variant: not with --hf"),
    ("export_model", ["--hf", "x", "--task", "no-such-task"], "invalid choice 'no-such-task'"),
    ("coverage_audit", ["--hf", "x", "--pte", "y.pte"], "not with --pte"),
    ("accuracy_report", ["--hf", "x", "--checkpoint", "y"], "--checkpoint: not with --hf"),
])
def test_bad_usage_exits_2(capsys, script, argv, message):
    with pytest.raises(SystemExit) as info:
        main = load_script(script).main if script == "export_model" else _report_main(script)
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def _report_main(script: str):
    from pipeline.evaluation.runner import report_main

    kind = "coverage" if script == "coverage_audit" else "accuracy"
    return lambda argv: report_main(kind, script, argv)


def test_a_missing_directory_exits_1_with_one_line(tmp_path, capsys):
    argv = ["--hf", str(tmp_path / "absent"), "--output-dir", str(tmp_path / "out")]
    assert load_script("export_model").main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("export_model: ") and "absent" in last
    assert not (tmp_path / "out").exists()
