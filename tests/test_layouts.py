"""Layouts tuned on a device (pipeline.wgsl.layouts, pipeline.tune, scripts/tune_layouts.py):
the file both runtimes read (the C++ from its binary twin: what Python wrote, and a damaged,
stale or missing twin refused by both), the same module for a launch, a table from another device refused loudly, the tables that ship with
the package taken by the device they were tuned on unless PIPELINE_LAYOUTS says otherwise, and
a tuned launch giving the same bits from the Python launch and the C++ call (in a child
process: both devices take their table once)."""

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.wgsl import ShaderFiles, layouts
from pipeline.wgsl.config import choose_config
from pipeline.wgsl.layouts import MAGIC, V2_MAGIC, Launch, Layout, Layouts, LayoutsError, parse, read
from support.scripts import ROOT, load_script

HEADER = f"{MAGIC}\nadapter Some GPU (driver 1.2)\nimplementation wgpu\n"
# (rows, width, dtype, threads per row, workgroup, 16-byte words): launches the rule holds, each
# in a layout other than its own. 18432x256 keeps the rule's threads in a larger workgroup,
# which must not move a bit; the others change the threads per row or read words, which moves
# some.
TUNED = [(4096, 1024, "float16", 32, 128, 0), (18432, 256, "float16", 16, 128, 0), (4096, 768, "float32", 32, 256, 0),
         (300, 1000, "bfloat16", 64, 64, 0), (77, 30, "float32", 8, 128, 0), (50, 4096, "float32", 128, 256, 0),
         (1500, 768, "float16", 32, 128, 1), (70, 128, "bfloat16", 4, 64, 1), (9, 3072, "float16", 128, 128, 1)]
# The same for RMSNorm launches (weight alone, no stats): each beside a LayerNorm launch of the
# same rows and width, which must keep its own layout.
TUNED_RMS = [(2048, 2304, "float32", 256, 256, 0), (16, 4096, "float16", 128, 128, 1), (2048, 896, "bfloat16", 64, 128, 0)]


def table_text(adapter="Some GPU (driver 1.2)", implementation="wgpu", stats=0):
    lines = [MAGIC, f"adapter {adapter}", f"implementation {implementation}"]
    lines += [f"layout layer_norm {dtype} {dtype} 1 1 {stats} {width} {rows} {threads} {workgroup} {words} 1.050"
              for rows, width, dtype, threads, workgroup, words in TUNED]
    lines += [f"layout rms_norm {dtype} {dtype} 1 0 0 {width} {rows} {threads} {workgroup} {words} 1.050"
              for rows, width, dtype, threads, workgroup, words in TUNED_RMS]
    return "\n".join(lines) + "\n"


def write_table(path: Path, text: str) -> Path:
    """`text` at `path`, with its binary twin beside it (as tune_layouts writes a table)."""
    path.write_text(text)
    layouts.write_twin(path)
    return path


def test_a_table_reads_back_as_written():
    table = parse(table_text(), "t.txt")
    assert (table.adapter, table.implementation) == ("Some GPU (driver 1.2)", "wgpu")
    assert len(table.entries) == len(TUNED) + len(TUNED_RMS)
    assert parse(table.text()).entries == table.entries
    launch = Launch("float16", "float16", True, True, False, 1024, 4096)
    assert table.entries[launch] == Layout(32, 128, False, 1.05)
    launch = Launch("float16", "float16", True, True, False, 768, 1500)
    assert table.entries[launch] == Layout(32, 128, True, 1.05)
    launch = Launch("float16", "float16", True, False, False, 4096, 16, "rms_norm")
    assert table.entries[launch] == Layout(128, 128, True, 1.05)


def test_a_version_2_table_is_read_as_layer_norms():
    v2 = table_text().replace(MAGIC, V2_MAGIC)
    v2 = "".join(line.replace("layout layer_norm ", "layout ") + "\n" for line in v2.splitlines() if "rms_norm" not in line)
    table = parse(v2)
    assert table.entries == {k: v for k, v in parse(table_text()).entries.items() if k.norm == "layer_norm"}
    assert table.text().startswith(MAGIC + "\n")  # written back as the current version


@pytest.mark.parametrize("rows, width, dtype, threads, workgroup, words", TUNED_RMS)
def test_an_rms_norm_launch_takes_its_layout_and_a_layer_norm_its_own(rows, width, dtype, threads, workgroup, words):
    table = parse(table_text())
    rule = choose_config(width, True, False, 32, dtype, rows=rows, write_stats=False, rms=True)
    tuned = table.config(rule, rows)
    assert (tuned.threads_per_row, tuned.workgroup, tuned.wide_words, tuned.rms) == (threads, workgroup, words, True)
    layer_norm = choose_config(width, True, False, 32, dtype, rows=rows, write_stats=False)
    assert table.config(layer_norm, rows) == layer_norm


def test_a_launch_takes_its_layout_and_no_other():
    table = parse(table_text())
    rule = choose_config(1024, True, True, 32, "float16", rows=4096, write_stats=False)
    tuned = table.config(rule, 4096)
    assert (tuned.threads_per_row, tuned.workgroup, tuned.hold) == (32, 128, 2 * rule.hold)
    assert tuned.source(ShaderFiles("naga")) != rule.source(ShaderFiles("naga"))
    # Other rows, stats stored, another affine form, another dtype: the rule's.
    other_rows = choose_config(1024, True, True, 32, "float16", rows=4097, write_stats=False)
    assert table.config(other_rows, 4097) == other_rows
    for other in (choose_config(1024, True, True, 32, "float16", rows=4096, write_stats=True),
                  choose_config(1024, True, False, 32, "float16", rows=4096, write_stats=False),
                  choose_config(1024, True, True, 32, "float16", "float32", rows=4096, write_stats=False),
                  choose_config(1024, True, True, 32, "bfloat16", rows=4096, write_stats=False)):
        assert table.config(other, 4096) == other


# Files each reader refuses, with the line it names (0: the file as a whole).
BAD = [
    ("", 0, "empty"),
    ("adapter X\n", 1, "not a layouts file"),
    (f"{MAGIC}\nadapter X\n", 0, "no implementation line"),
    (f"{MAGIC}\nimplementation wgpu\n", 0, "no adapter line"),
    (f"{MAGIC}\nadapter\nimplementation wgpu\n", 0, "no adapter line"),
    (HEADER + "adapter Y\n", 4, "a second adapter line"),
    (HEADER + "layouts layer_norm float16 float16 1 1 0 1024 4096 64 128 0 1.0\n", 4, "unknown line"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 128 1.0\n", 4, "12 fields"),
    ("pipeline-layouts 1\nadapter X\n", 1, "version 1, without the words column: tune this device again"),
    (HEADER + "layout layer_norm float64 float64 1 1 0 1024 4096 64 128 0 1.0\n", 4, "is not one of"),
    (HEADER + "layout layer_norm float16 bfloat16 1 1 0 1024 4096 64 128 0 1.0\n", 4, "the rows' dtype or float32"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 -4096 64 128 0 1.0\n", 4, "unsigned integers"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1_024 4096 64 128 0 1.0\n", 4, "unsigned integers"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 128 0 inf\n", 4, "unsigned integers"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 128 0 1e3\n", 4, "unsigned integers"),
    (HEADER + "layout layer_norm float16 float16 2 1 0 1024 4096 64 128 0 1.0\n", 4, "0 or 1"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 128 2 1.0\n", 4, "words are 0 or 1"),
    (HEADER + "layout layer_norm float16 float16 1 1 1 1024 4096 64 128 1 1.0\n", 4, "only plain rows"),
    (HEADER + "layout layer_norm float32 float32 1 1 0 1024 4096 64 128 1 1.0\n", 4, "only plain rows"),
    (HEADER + "layout layer_norm float16 float32 1 1 0 1024 4096 64 128 1 1.0\n", 4, "in the rows' dtype, not float32"),
    (HEADER + "layout layer_norm bfloat16 bfloat16 1 1 0 1000 4096 64 128 1 1.0\n", 4, "do not split into whole 16-byte"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 256 256 1 1.0\n", 4, "for each of 256 threads"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 0 4096 64 128 0 1.0\n", 4, "from 1 to"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4294967296 64 128 0 1.0\n", 4, "from 1 to"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 128 0 0.0\n", 4, "not positive"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 48 128 0 1.0\n", 4, "not a power of two"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 512 512 0 1.0\n", 4, "not a power of two"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 16 128 0 1.0\n", 4, "more than 8 loads"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 128 64 0 1.0\n", 4, "workgroup 64"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 96 0 1.0\n", 4, "workgroup 96"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 512 0 1.0\n", 4, "workgroup 512"),
    (HEADER + "layout layer_norm float32 float32 1 1 0 9000 64 256 256 0 1.0\n", 4, "streamed"),
    (HEADER + "layout layer_norm float16 float16 1 1 0 1024 4096 64 128 0 1.0\n\n"
     "layout layer_norm float16 float16 1 1 0 1024 4096 32 128 0 1.0\n", 6, "a second layout"),
    (HEADER + "layout group_norm float16 float16 1 1 0 1024 4096 64 128 0 1.0\n", 4, "is not one of layer_norm"),
    (HEADER + "layout rms_norm float16 float16 1 1 0 1024 4096 64 128 0 1.0\n", 4, "no bias and stores no stats"),
    (HEADER + "layout rms_norm float16 float16 1 0 1 1024 4096 64 128 0 1.0\n", 4, "no bias and stores no stats"),
    (f"{V2_MAGIC}\nadapter X\nimplementation wgpu\nlayout layer_norm float16 float16 1 1 0 1024 4096 64 128 0 1.0\n",
     4, "version 2 has 11 fields"),
]


@pytest.mark.parametrize("text, line, why", BAD)
def test_a_bad_file_is_refused_naming_its_line(text, line, why):
    with pytest.raises(LayoutsError, match=f"^bad.txt{f':{line}:' if line else ':'} .*{why}"):
        parse(text, "bad.txt")


def test_blanks_comments_and_crlf_are_read_alike():
    text = "# tuned by hand\r\n\r\n" + table_text().replace("\n", "\r\n").replace(" 1 1 ", " 1\t1  \v", 1)
    assert parse(text).entries == parse(table_text()).entries


def test_an_unreadable_file_names_itself(tmp_path):
    with pytest.raises(LayoutsError, match="cannot read the layouts file"):
        read(tmp_path / "missing.txt")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LayoutsError, match="binary.txt: cannot read"):
        read(tmp_path / "binary.txt")


def test_a_table_from_another_device_is_refused():
    table = parse(table_text(), "t.txt")
    table.check_device("Some GPU (driver 1.2)", "wgpu")
    for adapter, implementation in (("Other GPU", "wgpu"), ("Some GPU (driver 1.2)", "dawn")):
        with pytest.raises(LayoutsError, match="t.txt: tuned on 'Some GPU .* unset PIPELINE_LAYOUTS"):
            table.check_device(adapter, implementation)


# The tables that ship with the package


def test_the_shipped_tables_are_the_h200_s_named_by_their_device():
    tables = layouts.shipped()
    assert {(t.adapter, t.implementation) for t in tables} >= {("NVIDIA H200", "wgpu"), ("NVIDIA H200", "dawn")}
    for table in tables:
        # One file per adapter and implementation, so no two tables can claim a device.
        assert table.source == f"pipeline/wgsl/tuned/{layouts.shipped_name(table.adapter, table.implementation)}"
        assert table.entries


def test_a_shipped_table_is_picked_by_adapter_and_implementation_exactly():
    assert layouts.shipped_for("NVIDIA H200", "wgpu").source == "pipeline/wgsl/tuned/nvidia-h200-wgpu.txt"
    assert layouts.shipped_for("NVIDIA H200", "dawn").source == "pipeline/wgsl/tuned/nvidia-h200-dawn.txt"
    assert layouts.shipped_for("NVIDIA H100 80GB HBM3", "wgpu").source == (
        "pipeline/wgsl/tuned/nvidia-h100-80gb-hbm3-wgpu.txt")
    for adapter, implementation in (("NVIDIA H200 NVL", "wgpu"), ("nvidia h200", "wgpu"), ("NVIDIA H200", "vulkan"),
                                    ("NVIDIA H100 80GB HBM3", "dawn"), ("NVIDIA H100 PCIe", "wgpu")):
        assert layouts.shipped_for(adapter, implementation) is None


class _FakeDevice:
    """What the device layer reads of an opened device before it takes a layouts table."""

    features: frozenset = frozenset()

    def __init__(self, adapter: str, name: str = "wgpu") -> None:
        self.info, self.name = {"adapter": adapter}, name


@pytest.fixture
def fake_device(monkeypatch):
    """The Python runtime's device layer opening a fake of the adapter given: its table."""
    from pipeline.environment import F16_PACK_ENV
    from pipeline.runtime import device

    monkeypatch.setenv(F16_PACK_ENV, "0")
    monkeypatch.delenv("PIPELINE_WEBGPU", raising=False)

    def table(adapter: str, implementation: str = "wgpu") -> Layouts | None:
        monkeypatch.setattr(device, "_gpus", {})
        monkeypatch.setattr(device, "_refused", {})
        monkeypatch.setattr(device, "_open_device", lambda name: _FakeDevice(adapter, implementation))
        return device.gpu().layouts

    return table


def test_a_device_takes_the_table_shipped_for_it_unless_told_otherwise(fake_device, tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_LAYOUTS", raising=False)
    assert fake_device("NVIDIA H200").source == "pipeline/wgsl/tuned/nvidia-h200-wgpu.txt"
    assert fake_device("NVIDIA H200", "dawn").source == "pipeline/wgsl/tuned/nvidia-h200-dawn.txt"
    assert fake_device("Some GPU (driver 1.2)") is None  # none ships for it: the rule
    monkeypatch.setenv("PIPELINE_LAYOUTS", "")
    assert fake_device("NVIDIA H200").source == "pipeline/wgsl/tuned/nvidia-h200-wgpu.txt"
    # PIPELINE_LAYOUTS names a table: that one, refused where another device's.
    path = write_table(tmp_path / "mine.txt", table_text(adapter="NVIDIA H200"))
    monkeypatch.setenv("PIPELINE_LAYOUTS", str(path))
    assert fake_device("NVIDIA H200").source == str(path)
    with pytest.raises(LayoutsError, match="mine.txt: tuned on 'NVIDIA H200' through wgpu; this device is 'NVIDIA "
                                           "H200' through dawn"):
        fake_device("NVIDIA H200", "dawn")
    # none: the rule, the shipped table too.
    monkeypatch.setenv("PIPELINE_LAYOUTS", "none")
    assert fake_device("NVIDIA H200") is None


# The C++ backend (built on demand; tests/test_native.py's fixture).
@pytest.fixture(scope="module")
def native():
    from pipeline import native

    native.library()
    return native


def test_cpp_ships_the_tables_python_ships(native):
    for table in layouts.shipped():
        assert native.shipped_layouts(table.adapter, table.implementation) == (table.source, cpp_view(table)[2])
    for adapter, implementation in (("nvidia h200", "wgpu"), ("NVIDIA H200", "vulkan"), ("Some GPU", "wgpu")):
        assert native.shipped_layouts(adapter, implementation) is None


def cpp_view(table: Layouts) -> tuple[str, str, dict]:
    return table.adapter, table.implementation, {
        dataclasses.astuple(launch): (layout.threads_per_row, layout.workgroup, layout.wide_words)
        for launch, layout in table.entries.items()}


@pytest.mark.parametrize("text", [table_text(), "# tuned by hand\r\n\r\n" + table_text().replace("\n", "\r\n"),
                                  Layouts("Ünïcode GPU", "dawn").text()])
def test_cpp_reads_the_twin_python_writes(native, text):
    table = parse(text)
    assert native.decode_layouts(table.binary(text.encode()), "t.bin", text.encode()) == cpp_view(table)


def _resealed(data: bytes) -> bytes:
    """`data` with its checksum made right again (a twin changed on purpose, not damaged)."""
    body = data[:-8]
    return body + struct.pack("<Q", layouts.fnv1a64(body))


def _with_word(data: bytes, at: int, value: int) -> bytes:
    return _resealed(data[:at] + struct.pack("<I", value) + data[at + 4:])


def test_cpp_refuses_a_foreign_damaged_stale_or_newer_twin(native):
    text = table_text().encode()
    data = parse(table_text()).binary(text)
    first_record = len(data) - 8 - 11 * 4 * (len(TUNED) + len(TUNED_RMS))
    cases = [(b"", "not the binary twin of a layouts table"), (text, "not the binary twin of a layouts table"),
             (data[:-4], "damaged"), (data[:40] + bytes([data[40] ^ 1]) + data[41:], "damaged"),
             (data + b"\0\0\0\0", "damaged"), (_with_word(data, 4, 2), "of version 2; this backend reads version 1"),
             (_with_word(data, first_record, 2), "record 0 holds a value out of range")]
    for bad, why in cases:
        with pytest.raises(ValueError, match=f"^t.bin: .*{why}"):
            native.decode_layouts(bad, "t.bin", text)
    # Written from another text: stale (without a text to check, read as it is).
    with pytest.raises(ValueError, match="^t.bin: written from another version of its table: write it again"):
        native.decode_layouts(data, "t.bin", text + b"# edited\n")
    assert native.decode_layouts(data, "t.bin")[2] == cpp_view(parse(table_text()))[2]


def test_python_refuses_a_missing_or_stale_twin_as_the_cpp_does(tmp_path):
    path = write_table(tmp_path / "t.txt", table_text())
    assert read(path, twin=True).entries == parse(table_text()).entries
    with open(path, "a") as f:
        f.write("# edited by hand\n")
    with pytest.raises(LayoutsError, match=f"^{path}.bin: not the binary twin of {path} as it reads now .*--twin"):
        read(path, twin=True)
    assert read(path).entries == parse(table_text()).entries  # the text alone still reads
    layouts.write_twin(path)
    assert read(path, twin=True).entries == parse(table_text()).entries
    os.unlink(f"{path}.bin")
    with pytest.raises(LayoutsError, match=f"^{path}.bin: cannot read the binary twin of {path}, the table the C\\+\\+ "
                                           "backend reads .*No such file"):
        read(path, twin=True)


@pytest.fixture
def tune_layouts():
    """scripts/tune_layouts.py's main(argv), in this process (bad usage raises SystemExit(2)):
    it times the layouts it is given on this process's device, the one a child started with
    the same environment would open. What it sets in the environment (cli.quiet_dependencies:
    XDG_RUNTIME_DIR) is undone after the test."""
    before = dict(os.environ)
    yield load_script("tune_layouts").main
    for name in os.environ.keys() - before.keys():
        del os.environ[name]
    os.environ.update(before)


def test_a_twin_is_written_only_for_a_table_that_reads(tmp_path, tune_layouts, capsys):
    path = tmp_path / "t.txt"
    path.write_text(BAD[6][0])
    with pytest.raises(LayoutsError, match=f"^{path}:4: unknown line"):
        layouts.write_twin(path)
    assert not os.path.exists(f"{path}.bin")
    status = tune_layouts(["--twin", str(path)])
    err = capsys.readouterr().err
    assert status == 1 and f"{path}:4: unknown line" in err, err
    path.write_text(table_text())
    status = tune_layouts(["--twin", str(path)])
    printed = capsys.readouterr()
    assert status == 0 and f"wrote {path}.bin: 12 layouts" in printed.out, printed.err
    with pytest.raises(SystemExit) as exit:
        tune_layouts(["--twin", str(path), "--append"])
    assert exit.value.code == 2 and "alone" in capsys.readouterr().err


@pytest.mark.parametrize("rows, width, dtype, threads, workgroup, words", TUNED)
def test_cpp_module_in_a_tuned_layout_is_pythons(native, rows, width, dtype, threads, workgroup, words):
    table = parse(table_text())
    for launch_rows in (rows, rows + 1):
        for subgroup_size, compiler in ((0, "naga"), (32, "tint")):
            rule = choose_config(width, True, True, subgroup_size, dtype, rows=launch_rows, write_stats=False)
            tuned = table.config(rule, launch_rows)
            assert tuned.wide_words == (words == 1 and launch_rows == rows)
            want = tuned.source(ShaderFiles(compiler))
            got = native.wgsl_source(width, True, True, subgroup_size, dtype, rows=launch_rows, write_stats=False,
                                     compiler=compiler, layouts=table_text())
            assert got == want, (launch_rows, subgroup_size, compiler)


@pytest.mark.parametrize("rows, width, dtype, threads, workgroup, words", TUNED_RMS)
def test_cpp_rms_module_in_a_tuned_layout_is_pythons(native, rows, width, dtype, threads, workgroup, words):
    table = parse(table_text())
    rule = choose_config(width, True, False, 32, dtype, rows=rows, write_stats=False, rms=True)
    tuned = table.config(rule, rows)
    assert tuned.threads_per_row == threads and tuned != rule
    got = native.wgsl_source(width, True, False, 32, dtype, rows=rows, write_stats=False, compiler="tint",
                             layouts=table_text(), rms=True)
    assert got == tuned.source(ShaderFiles("tint"))


def test_tune_takes_the_best_other_layout_and_skips_streamed_rows(gpu_info):
    from pipeline.tune import tune

    held = Launch("float16", "float16", True, True, False, 1024, 64)
    rms = Launch("float32", "float32", True, False, False, 2304, 16, "rms_norm")
    lines = []
    # min_gain 0: the best layout other than the rule's enters whatever the timings (deterministic).
    table = tune([held, rms, Launch("float16", "float16", True, True, False, 7000, 9)], rounds=1, repeats=3,
                 min_gain=0, progress=lines.append)
    assert (table.adapter, table.implementation) == (gpu_info["adapter"], gpu_info["implementation"])
    assert list(table.entries) == [held, rms]
    for launch, layout in table.entries.items():
        rule = launch.rule()
        # Another layout: other threads, another workgroup, or the rule's own read in 16-byte words.
        assert (layout.threads_per_row, layout.workgroup, layout.wide_words) != (
            rule.threads_per_row, rule.workgroup, rule.wide_words) and layout.gain > 0
    assert any("layer_norm float16 9x7000: rows streamed" in line for line in lines)
    assert any(line.startswith("[2/3] rms_norm float32 16x2304:") for line in lines)


def test_tune_layouts_writes_a_table_both_runtimes_read_and_appends(tmp_path, gpu_info, native, tune_layouts,
                                                                    capsys):
    out = tmp_path / "tuned" / "layouts.txt"
    out.parent.mkdir()
    kept = Launch("float32", "float32", True, True, False, 768, 32)
    Layouts(gpu_info["adapter"], gpu_info["implementation"], {kept: Layout(32, 128, False, 1.1)}).write(out)
    status = tune_layouts(["--shapes", "64x1024,9x7000", "--dtype", "float16", "--out", str(out), "--append",
                           "--rounds", "1", "--repeats", "3"])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    assert "9x7000: rows streamed" in printed.out and f"wrote {out}" in printed.out
    table = read(out)
    assert (table.adapter, table.implementation) == (gpu_info["adapter"], gpu_info["implementation"])
    assert table.entries[kept] == Layout(32, 128, False, 1.1)  # --append kept the other launch's entry
    assert {(e.rows, e.width) for e in table.entries} <= {(32, 768), (64, 1024)}
    assert native.decode_layouts(open(f"{out}.bin", "rb").read(), "t.bin", out.read_bytes()) == cpp_view(table)


def test_tune_refuses_bad_arguments_before_timing(tmp_path, tune_layouts, capsys):
    (tmp_path / "other.txt").write_text(table_text())
    for args, why in ((["--min-gain", "0.5"], "at least 1"), (["--shapes", "0x5"], "positive"),
                      (["--norm", "rms_norm", "--stats"], "an rms_norm stores no mean and rstd"),
                      (["--out", str(tmp_path)], "is a directory"),
                      (["--out", str(tmp_path / "bad.txt"), "--append"], None)):
        if why is None:
            (tmp_path / "bad.txt").write_text("nonsense\n")
            why = "not a layouts file"
        full = ["--out", str(tmp_path / "t.txt"), *args] if "--out" not in args else args
        with pytest.raises(SystemExit) as exit:
            tune_layouts(full)
        err = capsys.readouterr().err
        assert exit.value.code == 2 and why in err, err
    status = tune_layouts(["--shapes", "8x64", "--out", str(tmp_path / "other.txt"), "--append", "--rounds", "1",
                           "--repeats", "2"])
    assert status == 1 and "tuned on 'Some GPU" in capsys.readouterr().err
    assert (tmp_path / "other.txt").read_text() == table_text()  # nothing lost


class TwoNorms(torch.nn.Module):
    """An affine LayerNorm, then one without weight and bias that also feeds its stats on."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.first = torch.nn.LayerNorm(width)
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x)
        z, mean, _rstd = torch.ops.aten.native_layer_norm(y[:2], [self.width], None, None, 1e-5)
        return z.sum() + mean.sum() + y


def test_a_program_s_launches_are_what_it_runs(tmp_path, gpu_info, tune_layouts, capsys):
    import pipeline
    from pipeline.tune import program_launches

    x = torch.randn(6, 40, 96)
    program = pipeline.lower(TwoNorms(96).eval(), (x,))
    assert program.coverage.delegated == 2
    launches = program_launches(program, (x,))
    assert launches == [Launch("float32", "float32", True, True, False, 96, 240),
                        Launch("float32", "float32", False, False, True, 96, 80)]
    # The command line takes them from the file, on the inputs given.
    program.save(tmp_path / "two.pte")
    torch.save((x,), tmp_path / "inputs.pt")
    out = tmp_path / "two.txt"
    capsys.readouterr()  # from here on, what the script prints
    status = tune_layouts(["--pte", str(tmp_path / "two.pte"), "--inputs", str(tmp_path / "inputs.pt"), "--out",
                           str(out), "--rounds", "1", "--repeats", "3"])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    assert "2 distinct launches" in printed.out
    assert "float32 240x96:" in printed.out and "float32 80x96:" in printed.out  # each timed
    assert {(e.rows, e.has_weight, e.write_stats) for e in read(out).entries} <= {(240, True, False), (80, False, True)}
    for args, why in ((["--shapes", "8x64"], "not with --shapes"), (["--dtype", "float16"], "not with --shapes"),
                      (["--stats"], "not with --shapes"), (["--inputs", "x.pt"], "only with --pte")):
        with pytest.raises(SystemExit) as exit:
            tune_layouts(["--out", str(out), *(["--pte", "two.pte"] if args[0] != "--inputs" else []), *args])
        assert exit.value.code == 2 and why in capsys.readouterr().err
    assert tune_layouts(["--pte", str(tmp_path / "two.pte"), "--out", str(out)]) == 1  # no model recorded beside it
    assert "coverage" in capsys.readouterr().err


def _child(table: str | None, *args: str, **env: str) -> subprocess.CompletedProcess:
    # This checkout first, and whatever else the parent's path holds (a GPU host's wheels).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, **env}
    env.pop("PIPELINE_LAYOUTS", None)
    if table is not None:
        env["PIPELINE_LAYOUTS"] = table
    return subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=300)


def test_both_runtimes_launch_in_the_tuned_layout(tmp_path, gpu_info):
    path = write_table(tmp_path / "here.txt", table_text(adapter=gpu_info["adapter"],
                                                         implementation=gpu_info["implementation"]))
    result = _child(str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    entries = len(TUNED) + len(TUNED_RMS)
    assert report["layouts"] == {"file": str(path), "entries": entries} and report["cpp"] == str(path)
    assert report["launched"] == entries + 1  # and a program in ExecuTorch's runtime


@pytest.fixture(scope="module")
def shipped_here(tmp_path_factory, gpu_info):
    """A folder of shipped tables, one of them this device's, and a build folder whose C++
    call library is built with them (the child builds it; the first child, once)."""
    folder = tmp_path_factory.mktemp("shipped")
    for table in layouts.shipped():
        shutil.copy(ROOT / table.source, folder)
    name = layouts.shipped_name(gpu_info["adapter"], gpu_info["implementation"])
    (folder / name).write_text(table_text(adapter=gpu_info["adapter"], implementation=gpu_info["implementation"]))
    (folder / "some-gpu-driver-1-2-wgpu.txt").write_text(table_text())
    return folder, f"pipeline/wgsl/tuned/{name}", {"PIPELINE_NATIVE_BUILD_DIR": str(tmp_path_factory.mktemp("build"))}


def test_both_runtimes_launch_in_the_table_shipped_for_their_device(shipped_here):
    # Unset: each runtime takes the shipped table of its adapter and implementation.
    folder, source, env = shipped_here
    result = _child(None, str(folder), **env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    entries = len(TUNED) + len(TUNED_RMS)
    assert report["layouts"] == {"file": source, "entries": entries} and report["cpp"] == source
    assert report["launched"] == entries


@pytest.mark.parametrize("setting", ["none", "table"])
def test_pipeline_layouts_overrides_the_shipped_table_in_both_runtimes(shipped_here, tmp_path, gpu_info, setting):
    folder, _, env = shipped_here
    path = tmp_path / "mine.txt"  # of this device, and empty: nothing to launch
    Layouts(gpu_info["adapter"], gpu_info["implementation"]).write(path)
    result = _child("none" if setting == "none" else str(path), str(folder), **env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    if setting == "none":  # the rule, in both
        assert report == {"layouts": None, "cpp": None}
    else:
        assert report == {"layouts": {"file": str(path), "entries": 0}, "cpp": str(path)}


def test_both_runtimes_refuse_a_table_from_another_device(tmp_path, gpu_info):
    path = write_table(tmp_path / "there.txt", table_text())
    result = _child(str(path))
    assert result.returncode == 3, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert "tuned on 'Some GPU (driver 1.2)'" in report["python"] and "tuned on 'Some GPU (driver 1.2)'" in report["cpp"]
    assert report["cpp"].startswith(f"{path}: ")


@pytest.mark.parametrize("where", ["folder", "missing"])
def test_both_runtimes_refuse_a_table_they_cannot_read(tmp_path, gpu_info, where):
    path = tmp_path if where == "folder" else tmp_path / "missing.txt"
    result = _child(str(path))
    assert result.returncode == 3, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    why = "Is a directory" if where == "folder" else "No such file or directory"
    for runtime in ("python", "cpp"):
        assert report[runtime].startswith(f"{path}: cannot read the layouts file: ") and why in report[runtime], report


@pytest.mark.parametrize("twin", ["missing", "stale"])
def test_both_runtimes_refuse_a_table_whose_twin_is_missing_or_stale(tmp_path, gpu_info, twin):
    path = write_table(tmp_path / "here.txt", Layouts(gpu_info["adapter"], gpu_info["implementation"]).text())
    if twin == "missing":
        os.unlink(f"{path}.bin")
    else:
        path.write_text(path.read_text() + "# edited by hand\n")
    result = _child(str(path))
    assert result.returncode == 3, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    for runtime in ("python", "cpp"):
        assert report[runtime].startswith(f"{path}.bin: ") and "scripts/tune_layouts.py --twin" in report[runtime]
    if twin == "missing":
        assert report["python"] == report["cpp"]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in [
    *(ROOT / "benchmarks" / "results").rglob("*.txt"), *(ROOT / "pipeline" / "wgsl" / "tuned").glob("*.txt")]
    if MAGIC + "\n" in p.read_text() or V2_MAGIC + "\n" in p.read_text()))
def test_the_committed_device_tables_read_and_relay_their_launches(path):
    # The H200's and H100's tables that docs/measurements.md quotes and the package ships: each
    # entry a layout its launch's rule takes there (subgroups of 32, pack2x16float), so every line serves.
    table = read(ROOT / path)
    assert table.adapter in ("NVIDIA H200", "NVIDIA H100 80GB HBM3") and table.entries
    for launch, layout in table.entries.items():
        tuned = table.config(launch.rule(32, True), launch.rows)
        assert (tuned.threads_per_row, tuned.workgroup, tuned.wide_words) == (
            layout.threads_per_row, layout.workgroup, layout.wide_words)


def child(shipped: str | None = None) -> int:
    """In a process whose devices take a table of TUNED's and TUNED_RMS's launches (the one
    PIPELINE_LAYOUTS names, or with `shipped`, a folder that then holds the package's tables,
    the one there for this device; the C++ built with them): each launch through the C++ call and the
    Python launch, same bits, and not the rule's bits (the layout changed the sums' order);
    without `shipped`, a program in ExecuTorch's runtime too. Prints a JSON line of the tables
    both runtimes took; exit 3 when the device refused the table."""
    from pipeline import blob
    from pipeline.runtime import delegate as delegate_module
    from pipeline.runtime import device as runtime_device
    from pipeline.runtime import launch, native_call
    from support.delegates import DTYPES, bits, make_delegate

    if shipped is not None:
        layouts.SHIPPED_DIR = Path(shipped)
    try:
        info = runtime_device.device_info()
    except LayoutsError as exc:
        try:
            native_call.device_name()
            cpp = ""
        except RuntimeError as refused:
            cpp = str(refused).removeprefix("the native call library has no device: ")
        print(json.dumps({"python": str(exc), "cpp": cpp}))
        return 3
    report = {"layouts": info["layouts"], "cpp": native_call.device_layouts()}
    g = runtime_device.gpu()
    if g.layouts is None or not g.layouts.entries:  # the rule's layouts everywhere
        print(json.dumps(report))
        return 0
    launched = 0
    for rows, width, dtype, threads, workgroup, words, rms in [(*t, False) for t in TUNED] + [
            (*t, True) for t in TUNED_RMS]:
        data, _ = make_delegate(width, dtype, bias="none" if rms else "constant",
                                op="rms_norm" if rms else "native_layer_norm")
        native = delegate_module.LayerNormDelegate(data)
        assert native._native is not None, "the native call library did not open the delegate"
        os.environ[native_call.NATIVE_CALL_ENV] = "0"
        python = delegate_module.LayerNormDelegate(data)
        del os.environ[native_call.NATIVE_CALL_ENV]
        x = (torch.randn(rows, width, generator=torch.Generator().manual_seed(width)) * 3 + 1).to(DTYPES[dtype])
        [got], [want] = native(x), python(x)
        assert torch.equal(bits(got), bits(want)), f"{rows}x{width} {dtype}: the C++ call differs from Python's"
        table, g.layouts = g.layouts, None
        [rule] = python(x)
        g.layouts = table
        tuned = launch.device_config(g, width, True, not rms, dtype, rows=rows, write_stats=False, rms=rms)
        assert (tuned.threads_per_row, tuned.workgroup, tuned.wide_words) == (threads, workgroup, words == 1)
        if not words:  # words move the sums' order too, but a few rows need not show it
            rule_threads = choose_config(width, True, not rms, dtype=dtype, rows=rows, write_stats=False,
                                         rms=rms).threads_per_row
            relaid = rule_threads != threads
            assert torch.equal(bits(rule), bits(want)) != relaid, f"{rows}x{width} {dtype}: threads {threads}"
        constants = blob.decode(data).constants
        affine = {r: torch.from_numpy(c.astype("float64") if dtype != "bfloat16" else
                                      (c.astype("int32") << 16).view("float32").astype("float64"))
                  for r, c in constants.items()}
        w, b = affine["weight"], affine.get("bias")
        if rms:
            reference = torch.nn.functional.rms_norm(x.double(), (width,), w, 1e-5)
            eager = torch.nn.functional.rms_norm(x.float(), (width,), w.float(), 1e-5).to(x.dtype)
        else:
            reference = torch.nn.functional.layer_norm(x.double(), (width,), w, b)
            eager = torch.nn.functional.layer_norm(x, (width,), w.to(x.dtype), b.to(x.dtype))
        ours, theirs = ((t.double() - reference).abs().max().item() for t in (want, eager))
        assert ours <= 2 * theirs, f"{rows}x{width} {dtype}: {ours} against eager's {theirs} from float64"
        launched += 1
    if shipped is not None:  # ExecuTorch's runtime opens the same C++ device
        print(json.dumps({**report, "launched": launched}))
        return 0
    # ExecuTorch's runtime with our backend: the same bits as the Python launch in the table's layout.
    import tempfile

    import pipeline
    from pipeline import native

    native.register()
    rows, width, dtype, threads, workgroup, words = TUNED[2]
    module = torch.nn.LayerNorm(width).eval()
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(5)) * 3
    program = pipeline.lower(module, (x,))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "layer_norm.pte")
        program.save(path)
        [got] = native.load(path)(x)
        os.environ[native_call.NATIVE_CALL_ENV] = "0"  # its delegates launch from Python
        want = pipeline.load(path)(x)
        table, g.layouts = g.layouts, None
        rule = pipeline.load(path)(x)
        g.layouts = table
    assert torch.equal(bits(got), bits(want)), "ExecuTorch's runtime differs from the Python launch"
    assert not torch.equal(bits(rule), bits(want)), "the program's rows came out as in the rule's layout"
    print(json.dumps({**report, "launched": launched + 1}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(child(*sys.argv[1:]))

