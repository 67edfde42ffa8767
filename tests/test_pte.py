"""The artifact runs: pipeline.load on exported files, round trips, damaged files, run_pte.py."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.evaluation.artifact import ArtifactError, read_artifact
from pipeline.interpreter import Program
from pipeline.outputs import same_outputs
from pipeline.pte.file import PteError
from pipeline.pte.file import PteFile
from pipeline.aot.export import ArtifactCheckError, export_model
from support.inputs import randn
from support.reference import assert_same_outputs
from support.scripts import SCRIPTS, load_script, run_script, script_env

pytestmark = pytest.mark.usefixtures("gpu_info")


@pytest.fixture(scope="module")
def block(small_block):
    """A linear, an affine LayerNorm and a GroupNorm reframed to a weight-less LayerNorm."""
    module, inputs, program, path, _ = small_block
    return module, inputs, program, path


def test_private_executorch_reader_is_the_pinned_one():
    # pipeline.pte.file relies on executorch's private flatbuffer reader: a new
    # executorch must be checked by hand before this pin moves.
    from importlib import metadata

    from executorch.exir._serialize import _flatbuffer_program

    assert metadata.version("executorch") == "1.4.1", "executorch changed: recheck pipeline/pte/file.py"
    assert callable(_flatbuffer_program._flatbuffer_to_program)


def test_saved_file_is_the_bytes_that_run(block):
    module, inputs, program, path = block
    assert path.read_bytes() == program.buffer
    loaded = pipeline.load(path)
    assert loaded.edge is None and loaded.num_delegates == program.num_delegates == 2
    assert (loaded.coverage.total, loaded.coverage.delegated, loaded.coverage.not_delegated) == (2, 2, [])
    assert same_outputs(loaded(*inputs), program(*inputs))
    fresh = (randn(2, 5, 12, seed=2), randn(2, 6, 7, seed=3))
    with torch.no_grad():
        assert_same_outputs(loaded(*fresh), module(*fresh))


def test_calls_are_independent(block):
    # Planned memory is reused between calls; outputs handed out must not change.
    _, inputs, program, _ = block
    first = program(*inputs)
    kept = [t.clone() for t in first]
    program(randn(2, 5, 12, seed=9), randn(2, 6, 7, seed=9))
    assert all(torch.equal(a, b) for a, b in zip(first, kept))


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        ((randn(2, 5, 12),), TypeError, "signature"),
        ((randn(2, 5, 12), randn(2, 6, 8)), ValueError, "outside what the program was exported for"),
        ((randn(2, 5, 12).double(), randn(2, 6, 7)), TypeError, "must be torch.float32"),
        ((randn(2, 5, 12), [1.0]), TypeError, "signature"),
    ],
)
def test_bad_inputs_are_refused_up_front(block, inputs, error, message):
    with pytest.raises(error, match=message):
        block[2](*inputs)


def _damaged(path: Path, tmp_path: Path, edit) -> Path:
    data = bytearray(path.read_bytes())
    edit(data)
    out = tmp_path / "damaged.pte"
    out.write_bytes(bytes(data))
    return out


def _flip(offset: int):
    def edit(data: bytearray) -> None:
        data[offset] ^= 0x10
    return edit


def test_truncated_files_are_refused(block, tmp_path):
    path = block[3]
    size = path.stat().st_size
    for cut in (0, 7, 30, 200, size // 2, size - 1):
        damaged = _damaged(path, tmp_path, lambda d: d.__delitem__(slice(cut, None)))
        with pytest.raises(PteError):
            pipeline.load(damaged)


@pytest.mark.parametrize("offset", [4, 5, 8, 12, 17, 18, 24])
def test_flipped_header_bytes_are_refused(block, tmp_path, offset):
    with pytest.raises(PteError):
        pipeline.load(_damaged(block[3], tmp_path, _flip(offset)))


def test_foreign_files_are_refused(tmp_path):
    for name, data in (("empty.pte", b""), ("text.pte", b"not a program at all" * 10), ("json.pte", b"{}")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(PteError, match="not an ExecuTorch program|empty file"):
            pipeline.load(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        pipeline.load(tmp_path / "missing.pte")


def _blob_span(path: Path) -> tuple[int, int]:
    """Where the first delegate blob lies in the file."""
    pte = PteFile.read(path)
    blob = pte.delegate_bytes(pte.plan.delegates[0])
    start = bytes(pte.data).index(blob)
    return start, len(blob)


def test_flipped_delegate_blob_is_refused(block, tmp_path):
    start, size = _blob_span(block[3])
    refused = 0
    for offset in range(start, start + size, max(1, size // 40)):
        try:
            pipeline.load(_damaged(block[3], tmp_path, _flip(offset)))
        except PteError as exc:
            assert "delegate 0" in str(exc)
            refused += 1
    assert refused == len(range(start, start + size, max(1, size // 40)))


def test_flipped_model_weights_load_but_change_outputs(block, tmp_path):
    # ExecuTorch's format has no checksum over the constant segment: a flipped weight
    # loads. What it changes is visible against the intact file (README says so).
    _, inputs, program, path = block
    pte = PteFile.read(path)
    weight = next(v.val for v in pte.plan.values if getattr(v.val, "data_buffer_idx", 0) > 0)
    _, offset = pte.constant(weight.data_buffer_idx, 4)
    damaged = pipeline.load(_damaged(path, tmp_path, _flip(offset + 3)))
    assert not same_outputs(damaged(*inputs), program(*inputs))


def test_foreign_delegates_and_unknown_operators_are_refused(block):
    pte = PteFile.read(block[3])
    pte.plan.delegates[0].id = "XnnpackBackend"
    with pytest.raises(PteError, match="backend 'XnnpackBackend'"):
        Program(pte)
    pte = PteFile.read(block[3])
    pte.plan.operators[0].name = "custom::mystery"
    pte.plan.operators[1].name = "custom::enigma"
    with pytest.raises(PteError, match="no kernel here: custom::enigma.*custom::mystery"):
        Program(pte)


def test_dynamic_bart_runs_at_three_lengths_from_one_file(checkpoints, exported):
    summary = exported("bart", dynamic=True).summary
    spec = pipeline.models.build("bart", checkpoint=checkpoints["bart"][0], dynamic=True)
    program = pipeline.load(summary["pte"])
    tokens, states = spec.example_inputs
    for length in (1, 5, tokens.shape[1] - 1):
        ids = torch.randint(0, 100, (tokens.shape[0], length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = spec.module(ids, states)
        assert_same_outputs(program(ids, states), want)


@pytest.mark.parametrize("name", ["bart", "whisper", "florence2"])
def test_exported_files_of_the_three_families_reproduce_eager(checkpoints, exported, name):
    summary = exported(name).summary
    assert read_artifact(summary["pte"])["pte_sha256"] == summary["pte_sha256"]
    spec = pipeline.models.build(name, checkpoint=checkpoints[name][0], seed=1)
    program = pipeline.load(summary["pte"])
    assert program.coverage.complete and program.coverage.total == summary["layer_norm_ops"]
    with torch.no_grad():
        assert_same_outputs(program(*spec.example_inputs), spec.module(*spec.example_inputs), atol=1e-4)


def test_export_keeps_no_file_that_does_not_reproduce_the_program(checkpoints, tmp_path, monkeypatch):
    def wrong_load(path):
        program = Program(PteFile.read(path))
        return lambda *inputs: program(*inputs) + 1.0

    monkeypatch.setattr(Program, "load", staticmethod(wrong_load))
    with pytest.raises(ArtifactCheckError, match="bit for bit"):
        export_model("whisper", checkpoint=checkpoints["whisper"][0], output_dir=tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.pte")) and not list((tmp_path / "out").glob(".*.tmp"))


def run_pte(*args: str) -> subprocess.CompletedProcess:
    return run_script("run_pte", *args)


def test_run_pte_runs_an_export_and_refuses_damage(checkpoints, exported, tmp_path, capsys):
    export = exported("whisper")
    for made in export.out.iterdir():  # a copy to damage
        shutil.copy(made, tmp_path)
    pte = tmp_path / Path(export.summary["pte"]).name
    ok = run_pte(str(pte), "--repeats", "1")
    assert ok.returncode == 0, ok.stderr
    assert "passed" in ok.stdout and "output 0: [" in ok.stdout  # batch: the utterances a whisper checkpoint takes
    # The refusals through the script's main() in this process (the script as a process above).
    main = load_script("run_pte").main
    capsys.readouterr()
    # A file changed after export no longer matches its coverage file.
    data = pte.read_bytes()
    pte.write_bytes(data[: len(data) // 2])
    assert main([str(pte)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()[-1]) > 0 and "describes another file" in err
    with pytest.raises(ArtifactError):
        read_artifact(pte)
    # Run on the user's own inputs, the truncation itself is what is refused.
    torch.save(pipeline.models.build("whisper", checkpoint=checkpoints["whisper"][0]).example_inputs, tmp_path / "in.pt")
    (tmp_path / pte.name.replace(".pte", ".coverage.json")).unlink()
    assert main([str(pte), "--inputs", str(tmp_path / "in.pt")]) == 1
    assert "truncated" in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(SystemExit) as info:
        main([str(pte), "--repeats", "0"])
    assert info.value.code == 2


def test_interrupted_export_leaves_no_temp_file(checkpoints, tmp_path, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(Program, "load", staticmethod(interrupted))
    with pytest.raises(KeyboardInterrupt):
        export_model("whisper", checkpoint=checkpoints["whisper"][0], output_dir=tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_sigterm_during_export_ends_with_one_line(checkpoints, tmp_path):
    import signal

    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "export_model.py"), "whisper", "--checkpoint",
                             str(checkpoints["whisper"][0]), "--output-dir", str(tmp_path / "out")],
                            stderr=subprocess.PIPE, text=True, env=script_env())
    for line in proc.stderr:
        # At once: an unloaded machine lowers and writes this small model in under 0.5 s.
        if "lowering" in line:
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    assert rest.strip().splitlines()[-1] == "export_model: interrupted; no file was left half-written"
    assert not list(tmp_path.glob("out/.*.tmp")) and not list(tmp_path.glob("out/*.pte"))


def test_calls_from_several_threads_take_turns(block):
    from concurrent.futures import ThreadPoolExecutor

    _, _, program, _ = block
    cases = [(randn(2, 5, 12, seed=s), randn(2, 6, 7, seed=s + 50)) for s in range(6)]
    want = [program(*inputs) for inputs in cases]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda inputs: program(*inputs), cases))
    assert all(same_outputs(g, w) for g, w in zip(got, want))
