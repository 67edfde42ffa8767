"""Files and folders that are not what they claim: a constant re-declared as another dtype,
a file far larger than its program, a path that is a folder, a socket, a link loop or a
/proc file, a full disk under the commands, a bad coverage file, a closed pipe. Each is
refused with an error that names it, or handled without losing work.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import importlib.util
import json
import os
import re
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from flatbuffers.table import Table
from torch import nn

import pipeline
from pipeline import blob
from pipeline.evaluation.artifact import runtime_loader
from pipeline.outputs import same_outputs
from pipeline.pte import operators
from pipeline.pte.file import PteError, PteFile
from support.waits import within

ROOT = Path(__file__).resolve().parent.parent


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def small(small_block):
    """conftest's SmallBlock file (read, never changed here): (.pte, inputs)."""
    _, inputs, _, path, _ = small_block
    return path, inputs


def _native_loader():
    from pipeline.native import build

    try:
        build.find_compiler()
        build.build()
    except build.BuildError as exc:
        pytest.skip(str(exc))
    return runtime_loader("executorch")


# -- a constant re-declared as another dtype (defect 7) -------------------------------------------


def _scalar_type_at(data: bytes, j: int) -> int:
    """Where value `j`'s (a tensor's) scalar_type byte lies in the file (program.fbs: Program's
    execution_plan is field 1, ExecutionPlan's values field 2, EValue's val field 1, Tensor's
    scalar_type field 0; a field's vtable slot is 4 + 2 * its index)."""

    def item(table: Table, slot: int, k: int) -> Table:
        return Table(table.Bytes, table.Indirect(table.Vector(table.Offset(slot)) + 4 * k))

    root = Table(bytearray(data), struct.unpack_from("<I", data, 0)[0])
    value = item(item(root, 6, 0), 8, j)
    tensor = Table(value.Bytes, value.Indirect(value.Pos + value.Offset(6)))
    assert tensor.Offset(4), "scalar_type is stored (FLOAT is not the schema's default)"
    return tensor.Pos + tensor.Offset(4)


def _constants(data: bytes) -> dict[int, tuple[int, bool]]:
    """value -> (scalar_type, read by some instruction) for every constant tensor."""
    from executorch.exir import schema

    plan = PteFile(data, "intact").plan
    read = {j for i in plan.chains[0].instructions for j in getattr(i.instr_args, "args", [])}
    return {j: (int(v.val.scalar_type), j in read) for j, v in enumerate(plan.values)
            if isinstance(v.val, schema.Tensor) and v.val.allocation_info is None and v.val.data_buffer_idx > 0}


def test_every_constant_redeclared_as_another_dtype_is_refused_at_load(small, tmp_path):
    # Type promotion keeps every operator's output dtype (a float tensor times a scalar
    # constant re-declared int16 is still float), and a small constant still fits its aligned
    # slot, so such a file would run to another answer: each is refused at load by both
    # runtimes; a constant no instruction reads changes nothing (same outputs) unless it no
    # longer fits its slot.
    path, inputs = small
    data = path.read_bytes()
    loads = {"python": pipeline.load, "executorch": _native_loader()}
    reference = {name: load(path)(*inputs) for name, load in loads.items()}
    constants = _constants(data)
    assert sum(read for _, read in constants.values()) >= 5, constants
    outcomes = {}
    for j, (code, read) in constants.items():
        at = _scalar_type_at(data, j)
        for other in operators.DTYPES:
            if other == code:
                continue
            damaged = tmp_path / f"v{j}-{other}.pte"
            damaged.write_bytes(data[:at] + bytes([other]) + data[at + 1:])
            for name, load in loads.items():
                try:
                    program = load(damaged)
                except PteError:
                    outcomes[j, other, name] = "refused"
                    continue
                try:
                    outputs = program(*inputs)
                except RuntimeError:  # before: "self and mat2 must have the same dtype", at the call
                    outcomes[j, other, name] = "failed at the call"
                    continue
                outcomes[j, other, name] = "same" if same_outputs(outputs, reference[name]) else "different"
            # One no instruction reads is refused when it no longer fits its slot.
            expected = {"refused"} if read else {"refused", "same"}
            assert outcomes[j, other, "python"] == outcomes[j, other, "executorch"] in expected, \
                (j, operators.DTYPES[other], {k: v for k, v in outcomes.items() if k[0] == j})


def test_a_constant_of_its_operators_dtype_loads(tmp_path):
    # The check is on what the exporter makes: an index constant keeps its integer dtype,
    # an int buffer added to a float tensor is cast by the exporter first.
    class Indexed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(4)
            self.register_buffer("order", torch.tensor([3, 2, 1, 0]))
            self.register_buffer("shift", torch.tensor([1, 2, 3, 4], dtype=torch.int32))

        def forward(self, x):
            return self.ln(x).index_select(1, self.order) + self.shift

    x = randn(2, 4)
    module = Indexed().eval()
    program = pipeline.lower(module, (x,))
    program.save(tmp_path / "indexed.pte")
    assert same_outputs(pipeline.load(tmp_path / "indexed.pte")(x), program(x))
    torch.testing.assert_close(program(x), module(x))


# -- a file larger than its program (defect 3) ------------------------------------------------------

GIB = 1 << 30


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_a_sparse_4_gib_file_is_refused_from_its_first_bytes(tmp_path, runtime):
    # Before: read whole (4.4 GB resident, 19 s) before its identifier was checked.
    load = pipeline.load if runtime == "python" else _native_loader()
    path = tmp_path / "sparse.pte"
    with open(path, "wb") as f:
        f.truncate(4 * GIB)  # no disk: a hole
    peak = _peak_rss_bytes()
    with pytest.raises(PteError, match=r"sparse\.pte: not an ExecuTorch program \(\.pte\): identifier"):
        load(path)
    assert _peak_rss_bytes() < peak + GIB


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_a_program_followed_by_4_gib_is_refused_unread(small, tmp_path, runtime):
    # Before: accepted, and all 4 GiB stayed in the loaded program's memory.
    load = pipeline.load if runtime == "python" else _native_loader()
    path = tmp_path / "long.pte"
    data = small[0].read_bytes()
    path.write_bytes(data)
    with open(path, "r+b") as f:
        f.truncate(len(data) + 4 * GIB)
    peak = _peak_rss_bytes()
    with pytest.raises(PteError, match=rf"long\.pte: {len(data) + 4 * GIB} bytes, but its header accounts for "
                                       rf"{len(data)}: the {4 * GIB} bytes after the program's end"):
        load(path)
    assert _peak_rss_bytes() < peak + GIB


def test_bytes_after_the_program_are_refused_in_memory_too(small):
    data = small[0].read_bytes()
    with pytest.raises(PteError, match="the 3 bytes after the program's end are no part of it"):
        PteFile(data + b"abc", "long")
    with pytest.raises(PteError, match=f"truncated: {len(data) - 1} bytes of {len(data)}"):
        PteFile(data[:-1], "short")
    assert PteFile(data, "intact").plan is not None


# -- a full disk (defect 9) -------------------------------------------------------------------------


class _FullDisk:
    """`os` as pipeline.ioutil sees it, on a disk that fills up: the `n`th write to a file
    opened through it writes half its bytes and fails with ENOSPC, as do later writes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.writes = 0

    def __getattr__(self, name: str):
        return getattr(os, name)

    def fdopen(self, *args, **kwargs):
        return _FillingFile(self, os.fdopen(*args, **kwargs))


class _FillingFile:
    def __init__(self, disk: _FullDisk, f) -> None:
        self.disk = disk
        self.f = f

    def write(self, data: bytes) -> int:
        self.disk.writes += 1
        if self.disk.writes >= self.disk.n:
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


@pytest.fixture
def full_disk(monkeypatch):
    """`full_disk(n)`: from now on, the `n`th file write of pipeline.ioutil fails with ENOSPC."""
    import pipeline.ioutil

    def fill(n: int) -> _FullDisk:
        disk = _FullDisk(n)
        monkeypatch.setattr(pipeline.ioutil, "os", disk)
        return disk
    return fill


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_cli", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_results_reach_stdout_when_the_disk_is_full(tmp_path, monkeypatch, capsys, full_disk):
    # Before: a traceback, and every result lost.
    bench = _load_script("bench_layer_norm")
    result = {"adapter": "test", "results": [{"rows": 8, "width": 64, "kernel_us": 12.5}]}
    monkeypatch.setattr(bench, "run_benchmark", lambda *a, **k: result)
    full_disk(1)
    assert bench.main(["--shapes", "8x64", "--json", str(tmp_path / "bench.json")]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == result
    assert err.count("\n") == 1 and "No space left on device" in err and "bench.json" in err, err
    assert list(tmp_path.iterdir()) == []


def _tiny_bart_checkpoint(directory: Path, seed: int) -> Path:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128,
                        max_position_embeddings=64)
    torch.manual_seed(seed)
    BartForConditionalGeneration(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture
def exported(exported):
    """conftest's tiny bart export (read, never changed here): (output folder, .pte, coverage file)."""
    out = exported("bart").out
    return out, next(out.glob("*.pte")), next(out.glob("*.coverage.json"))


def test_an_export_writes_its_pte_and_coverage_file_as_a_pair(exported):
    _, pte, coverage = exported
    summary = json.loads(coverage.read_text())
    assert summary["pte_sha256"] == hashlib.sha256(pte.read_bytes()).hexdigest()
    assert summary["export_seconds"] > 0
    assert sorted(p.name for p in pte.parent.iterdir()) == sorted([pte.name, coverage.name])


@pytest.mark.parametrize("failing", [1, 2], ids=["the .pte", "the coverage file"])
def test_a_full_disk_leaves_the_previous_pte_and_coverage_pair(exported, tmp_path, full_disk, failing):
    # Before: with the coverage write failing, the new .pte stood beside the old coverage file.
    from pipeline.aot.export import export_model

    out, pte, coverage = exported
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / pte.name).write_bytes(b"the previous .pte")
    (folder / coverage.name).write_text("the previous coverage")
    checkpoint = _tiny_bart_checkpoint(tmp_path / "checkpoint", seed=2)
    disk = full_disk(failing)
    with pytest.raises(OSError, match="No space left on device"):
        export_model("bart", checkpoint=checkpoint, output_dir=folder)
    assert disk.writes == failing
    assert (folder / pte.name).read_bytes() == b"the previous .pte"
    assert (folder / coverage.name).read_text() == "the previous coverage"
    assert sorted(p.name for p in folder.iterdir()) == sorted([pte.name, coverage.name])


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_a_full_disk_leaves_the_previous_report_set(exported, tmp_path, capsys, full_disk, failing):
    # Before: the report's JSON was replaced and its Markdown and HTML were not.
    from pipeline.evaluation.runner import report_main

    _, pte, _ = exported
    reports = tmp_path / "reports"
    assert report_main("coverage", "doc", ["--pte", str(pte), "--output-dir", str(reports)]) == 0
    written = sorted(reports.iterdir())
    assert [p.suffix for p in written] == [".html", ".json", ".md"]
    for path in written:
        path.write_text(f"the previous {path.suffix}")
    capsys.readouterr()
    full_disk(failing)
    assert report_main("coverage", "doc", ["--pte", str(pte), "--output-dir", str(reports)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err, err
    assert sorted(reports.iterdir()) == written
    for path in written:
        assert path.read_text() == f"the previous {path.suffix}"


# -- paths that are not a .pte file (defects 11 and 12) ---------------------------------------------


def _paths(folder: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a path that is no .pte file, what the error must say)."""
    (folder / "folder.pte").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "socket.pte"))
    (folder / "loop-a.pte").symlink_to(folder / "loop-b.pte")
    (folder / "loop-b.pte").symlink_to(folder / "loop-a.pte")
    (folder / "proc.pte").symlink_to("/proc/self/status")
    return {
        "a folder": (folder / "folder.pte", "folder.pte: a directory, not a .pte file"),
        "a socket": (folder / "socket.pte", r"socket.pte: not a regular file \(a socket\)"),
        "a link loop": (folder / "loop-a.pte", "loop-a.pte: a loop of symbolic links, not a file"),
        "a /proc file": (folder / "proc.pte", r"proc.pte: its size reads as 0 but it has contents: a file the "
                                              r"kernel makes \(/proc, /sys\), not a .pte"),
    }


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_paths_that_are_not_files_are_refused_saying_what_they_are(tmp_path, runtime):
    # Before: a folder was IsADirectoryError naming file descriptor "3", a socket an OSError
    # (ENXIO), a link loop an OSError, a /proc file "empty file".
    load = pipeline.load if runtime == "python" else _native_loader()
    for name, (path, message) in _paths(tmp_path).items():
        with pytest.raises(PteError, match=message):
            load(path)


def test_run_pte_says_what_a_path_is(tmp_path):
    # Before: run_pte called a link loop "not found" and a /proc file "empty file".
    from pipeline.evaluation.artifact import ArtifactError, read_artifact, run_artifact

    for name, (path, message) in _paths(tmp_path).items():
        with pytest.raises((ArtifactError, PteError), match=message):
            run_artifact(path)
        if name != "a /proc file":  # a regular file: its coverage file is what is missing
            with pytest.raises(ArtifactError, match=message):
                read_artifact(path)


def _widened(data: bytes, width: int) -> bytes:
    """A one-LayerNorm file (input and output [2, 8], no affine; input at offset 64 of arena 1)
    made to normalize rows of `width` values: sizes, offsets, arena and blob changed alike,
    so every check but the adapter's binding limit passes."""
    def item(table: Table, slot: int, k: int) -> Table:
        return Table(table.Bytes, table.Indirect(table.Vector(table.Offset(slot)) + 4 * k))

    def tensor(j: int) -> Table:
        value = item(plan, 8, j)
        return Table(value.Bytes, value.Indirect(value.Pos + value.Offset(6)))

    out = bytearray(data)
    plan = item(Table(bytearray(data), struct.unpack_from("<I", data, 0)[0]), 6, 0)
    for j in (0, 1):  # Tensor.sizes (field 2), int32
        struct.pack_into("<ii", out, tensor(j).Vector(tensor(j).Offset(8)), 1, width)
    allocation = Table(tensor(0).Bytes, tensor(0).Indirect(tensor(0).Pos + tensor(0).Offset(16)))
    struct.pack_into("<I", out, allocation.Pos + allocation.Offset(6), width * 4)  # memory_offset_low
    struct.pack_into("<q", out, plan.Vector(plan.Offset(20)) + 8, 2 * width * 4)  # non_const_buffer_sizes[1]
    pte = PteFile(data, "small")
    old = pte.delegate_bytes(pte.plan.delegates[0])
    decoded = blob.decode(old)
    new = blob.encode(dataclasses.replace(decoded, params=dataclasses.replace(decoded.params, normalized_shape=(width,))))
    at = bytes(out).index(old)
    out[at:at + len(old)] = new
    return bytes(out)


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_a_delegate_wider_than_the_binding_limit_is_refused_naming_both(tmp_path, runtime):
    # Before: RuntimeError ("opening the delegate on the GPU failed") in the Python runtime,
    # "Failed to load method forward, error: 0x:1" in ExecuTorch's.
    from pipeline import runtime as webgpu

    load = pipeline.load if runtime == "python" else _native_loader()
    pipeline.lower(nn.LayerNorm(8, elementwise_affine=False).eval(), (randn(2, 8),)).save(tmp_path / "narrow.pte")
    limits = webgpu.device_info()["limits"]
    limit = min(limits["max-storage-buffer-binding-size"], limits["max-buffer-size"])
    width = limit // 4 + 1
    (tmp_path / "wide.pte").write_bytes(_widened((tmp_path / "narrow.pte").read_bytes(), width))
    with pytest.raises(PteError, match=rf"wide.pte: delegate 0: a row of {width} values \({width * 4} bytes of "
                                       rf"float32\) exceeds this adapter's binding limit of {limit} bytes"):
        load(tmp_path / "wide.pte")
    (tmp_path / "fits.pte").write_bytes(_widened((tmp_path / "narrow.pte").read_bytes(), 64))
    assert load(tmp_path / "fits.pte")(randn(1, 64)) is not None


# -- coverage files, files that cannot run, a closed stdout (defect 12) -----------------------------


@pytest.mark.parametrize(("change", "message"), [
    ({"model": None}, "has no 'model'"),
    ({"variant": 3}, "'variant' is 3, expected str"),
    ({"seed": "0"}, "'seed' is \"0\", expected int"),
    ({"seed": -1}, "'seed' is -1, expected int \\(not negative\\)"),
    ({"checkpoint": []}, "'checkpoint' is \\[\\], expected str or null"),
    ({"dynamic": 1}, "'dynamic' is 1, expected bool"),
])
def test_a_bad_coverage_file_is_an_artifact_error(exported, tmp_path, change, message):
    # Before: KeyError: 'model' (and the like) from deep inside run_pte and the --pte reports.
    from pipeline.evaluation.artifact import ArtifactError, read_artifact_file, run_artifact

    _, pte, coverage = exported
    summary = json.loads(coverage.read_text())
    for key, value in change.items():
        if value is None:
            del summary[key]
        else:
            summary[key] = value
    (tmp_path / pte.name).write_bytes(pte.read_bytes())
    (tmp_path / coverage.name).write_text(json.dumps(summary))
    for read in (read_artifact_file, run_artifact):
        with pytest.raises(ArtifactError, match=f"{coverage.name}: {message}" if "has no" not in message
                           else f"{coverage.name} {message}: not a coverage file written by export_model"):
            read(tmp_path / pte.name)


def test_a_coverage_file_that_is_special_too_large_or_too_deep_is_refused_without_waiting(exported, tmp_path, capsys):
    # Before: a named pipe there hung run_pte and the --pte reports, and /dev/zero was read without end.
    from pipeline.evaluation.artifact import COVERAGE_MAX_BYTES, ArtifactError, read_artifact_file
    from support.scripts import load_script

    _, pte, coverage = exported
    copy, target = tmp_path / pte.name, tmp_path / coverage.name
    copy.write_bytes(pte.read_bytes())

    def sparse(path):
        with open(path, "wb") as f:
            f.truncate(COVERAGE_MAX_BYTES + 1)

    run_pte = load_script("run_pte")
    for make, why in ((os.mkfifo, r"Not a regular file \(a named pipe\)"),
                      (lambda p: os.symlink("/dev/zero", p), r"Not a regular file \(a character device\)"),
                      (sparse, f"Larger than {COVERAGE_MAX_BYTES} bytes"),
                      (lambda p: p.write_text("[" * 100_000), "JSON nested too deep")):
        make(target)
        with within(20), pytest.raises(ArtifactError, match=f"{coverage.name} unreadable: .*{why}"):
            read_artifact_file(copy)
        with within(20):
            assert run_pte.main([str(copy)]) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and re.search(f"{coverage.name} unreadable: .*{why}", err), err
        target.unlink()


def test_the_coverage_audit_of_a_file_that_cannot_run_fails(exported, tmp_path, monkeypatch, capsys):
    # Before: "complete" (the audit counted the file's delegates and never ran it).
    from pipeline.evaluation.runner import report_main
    from pipeline.runtime.delegate import LayerNormDelegate

    def lost(self, *args):
        raise RuntimeError("the device was lost")

    _, pte, _ = exported
    monkeypatch.setattr(LayerNormDelegate, "__call__", lost)
    assert report_main("coverage", "doc", ["--pte", str(pte), "--output-dir", str(tmp_path)]) == 1
    report = json.loads((tmp_path / f"{pte.stem}.pte.coverage.json").read_text())
    assert report["verdict"] == "incomplete"
    assert report["notes"] == ["the program cannot run on the example inputs: RuntimeError: the device was lost"]
    assert "verdict failed" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["coverage_audit", "accuracy_report"])
def test_a_report_piped_into_head_writes_its_files_and_exits_quietly(exported, tmp_path, script):
    # Before: BrokenPipeError at the second progress line: exit 1 and no report written.
    _, pte, _ = exported
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / f"{script}.py"), "--pte", str(pte),
                             "--output-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 0, err
    assert first.startswith(b"[")
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    kind = "coverage" if script == "coverage_audit" else "accuracy"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{pte.stem}.pte.{kind}{suffix}" for suffix in (".html", ".json", ".md"))


# -- a layouts table that is not a regular file, or never ends ------------------------------------


@pytest.fixture
def special_tables(tmp_path):
    """(path, what both readers say of it) for a named pipe, /dev/zero and a sparse file one
    byte over the bound."""
    from pipeline.environment import LAYOUTS_MAX_BYTES

    fifo, large = tmp_path / "fifo.txt", tmp_path / "large.txt"
    os.mkfifo(fifo)
    with open(large, "wb") as f:
        f.truncate(LAYOUTS_MAX_BYTES + 1)
    return [(fifo, r"Not a regular file \(a named pipe\)"), ("/dev/zero", r"Not a regular file \(a character device\)"),
            (large, f"Larger than {LAYOUTS_MAX_BYTES} bytes")]


class _FakeDevice:
    """What the device layer reads of an opened device before it checks the layouts table."""

    name = "wgpu"
    features: frozenset = frozenset()
    info = {"adapter": "This GPU"}


@pytest.fixture
def fake_devices(monkeypatch):
    """The Python runtime's device layer with no device open, opening fakes; their count."""
    from pipeline.environment import F16_PACK_ENV
    from pipeline.runtime import device

    opened = []
    monkeypatch.setattr(device, "_gpus", {})
    monkeypatch.setattr(device, "_open_device", lambda name: opened.append(name) or _FakeDevice())
    monkeypatch.setenv(F16_PACK_ENV, "0")
    monkeypatch.delenv("PIPELINE_WEBGPU", raising=False)
    return device, opened


def test_the_python_runtime_refuses_a_special_layouts_file_without_waiting(fake_devices, special_tables,
                                                                           monkeypatch):
    from pipeline.wgsl.layouts import LayoutsError

    device, opened = fake_devices
    for path, why in special_tables:
        monkeypatch.setenv("PIPELINE_LAYOUTS", str(path))
        with within(20), pytest.raises(LayoutsError, match=f"{path}: cannot read the layouts file: .*{why}"):
            device.gpu()
    assert opened == []  # a table that cannot be read opens no device


def test_a_table_of_another_device_opens_one_device_however_often_refused(fake_devices, tmp_path, monkeypatch):
    from pipeline.wgsl.layouts import Layouts, LayoutsError

    device, opened = fake_devices
    table = tmp_path / "there.txt"
    Layouts("Some GPU", "wgpu").write(table)
    monkeypatch.setenv("PIPELINE_LAYOUTS", str(table))
    for _ in range(3):
        with pytest.raises(LayoutsError, match="tuned on 'Some GPU'"):
            device.gpu()
    assert opened == ["wgpu"]
    monkeypatch.delenv("PIPELINE_LAYOUTS")
    assert device.gpu().impl is not None and opened == ["wgpu"]  # the same device, once the table is gone


def test_the_cpp_backend_refuses_a_special_layouts_file_without_waiting(special_tables, gpu_info):
    code = ("from pipeline.runtime import native_call\ntry:\n    native_call.device_name()\n"
            "except RuntimeError as exc:\n    print(exc)\n")
    for path, why in special_tables:
        env = {**os.environ, "PIPELINE_LAYOUTS": str(path)}
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                                cwd=ROOT)
        assert re.search(f"{path}: cannot read the layouts file: {why}", result.stdout), result.stdout + result.stderr


def test_the_layouts_reader_refuses_a_special_file_without_waiting(special_tables):
    # The reader tune_layouts --append uses; before, a named pipe hung it and /dev/zero was read without end.
    from pipeline.wgsl.layouts import LayoutsError, read

    for path, why in special_tables:
        with within(20), pytest.raises(LayoutsError, match=f"{path}: cannot read the layouts file: .*{why}"):
            read(path)


def test_tune_layouts_refuses_a_special_table_to_append_to_without_waiting(special_tables, capsys):
    from support.scripts import load_script

    tune_layouts = load_script("tune_layouts")
    for path, why in special_tables:
        with within(20), pytest.raises(SystemExit) as info:
            tune_layouts.main(["--out", str(path), "--append", "--shapes", "4x8"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and re.search(f"{path}: cannot read the layouts file: .*{why}", err), err


def test_an_inputs_file_that_is_a_named_pipe_is_refused_without_waiting(tmp_path):
    from pipeline.evaluation.artifact import read_inputs

    fifo = tmp_path / "inputs.pt"
    os.mkfifo(fifo)
    with within(20), pytest.raises(ValueError, match=r"inputs.pt: not a torch.save file .*Not a regular file \(a named pipe\)"):
        read_inputs(fifo)


def _deflated(path: Path, value: object) -> Path:
    """`value` torch.save'd to `path`, then every entry of the zip recompressed: torch.load
    inflates such entries, so the file holds far fewer bytes than it loads."""
    import io
    import zipfile

    buffer = io.BytesIO()
    torch.save(value, buffer)
    with zipfile.ZipFile(buffer) as saved, zipfile.ZipFile(path, "w") as out:
        for name in saved.namelist():
            out.writestr(name, saved.read(name), compress_type=zipfile.ZIP_DEFLATED)
    return path


def test_a_torch_file_that_loads_more_bytes_than_it_holds_is_refused_unloaded(tmp_path, monkeypatch):
    # Before: loaded; 64 KB here inflate to 64 MiB, and 4 MB would to 4 GB (a .pt's bound was said
    # to be its own size).
    from pipeline.evaluation import artifact
    from pipeline.models import CheckpointError, from_hf, hf

    zeros = torch.zeros(16 << 20)  # 64 MiB
    inputs = _deflated(tmp_path / "inputs.pt", (zeros,))
    assert inputs.stat().st_size < 1 << 20
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("loaded"))
    why = rf"its zip entries declare at least \d+ bytes, more than the file's {inputs.stat().st_size}"
    with pytest.raises(ValueError, match=rf"inputs.pt: not a torch.save file .*{why}"):
        artifact.read_inputs(inputs)
    with pytest.raises(ValueError, match=rf"inputs {inputs}: unreadable .*{why}"):
        hf.read_inputs(inputs, nn.Linear(2, 2))
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                                                       "num_attention_heads": 2, "intermediate_size": 64,
                                                       "vocab_size": 100}))
    _deflated(directory / "pytorch_model.bin", {"bert.embeddings.word_embeddings.weight": zeros})
    with pytest.raises(CheckpointError, match="pytorch_model.bin is unreadable: .*its zip entries declare"):
        from_hf(directory)
