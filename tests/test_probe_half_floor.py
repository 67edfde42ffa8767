"""benchmarks/probe_half_floor.py: its variants are the kernel's text edited, so every edit
must still match the kernel, and the exact ones must keep the kernel's values."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import probe_half_floor as probe  # noqa: E402

pytestmark = pytest.mark.usefixtures("gpu_info")


@pytest.mark.parametrize("dtype, width", [("float16", 1024), ("float32", 768)])
def test_exact_variants_keep_the_kernels_values_and_the_least_ones_show_their_errors(dtype, width):
    (row,) = probe.check([(0, width)], [dtype], rows_each=16)
    worst, not_exact = row["worst_over_kernel"], row["not_exact_where_kernel_is"]
    # EXACT is of float16 rows, the probe's subject; in float32 only the layouts are.
    exact = [n for n in worst if probe.exact(n) and (dtype == "float16" or n.startswith(("t", "wg")))]
    assert len(exact) > 5 and any(n.startswith("t") and "_wg" in n for n in exact)
    # The 16-byte forms rebind x and out (float16 rows whose width is a multiple of 8).
    assert (dtype == "float16") == any(n.startswith(("wide_", "wide_x_")) for n in exact)
    for name in exact:
        assert worst[name] <= 1.5 and not not_exact[name], (name, worst[name], not_exact[name])
    # The check can fail: the one-pass LayerNorm (E[x^2] - E[x]^2) is far off on rows a
    # float16 ulp apart at 1000, where the kernel's error is under a thousandth.
    assert worst["least"] > 100
    assert any(n.startswith("floor_") for n in worst)
    assert (dtype == "float16") == any(n.startswith("floor_wide_") for n in worst)


def test_results_are_saved_after_every_shape(tmp_path, monkeypatch):
    out = tmp_path / "probe.json"
    monkeypatch.setattr(sys, "argv", ["probe_half_floor.py", "--json", str(out), "--shapes", "8x256,4x1024",
                                      "--dtypes", "float16", "--rounds", "1", "--repeats", "2",
                                      "--variants", "kernel,grid"])
    saved = []
    write = probe.write_json_atomic
    monkeypatch.setattr(probe, "write_json_atomic", lambda path, data: (saved.append(len(data["results"])),
                                                                         write(path, data)))
    probe.main()
    assert saved == [1, 2]
    results = json.loads(out.read_text())["results"]
    assert [(r["rows"], r["width"]) for r in results] == [(8, 256), (4, 1024)]
    assert all("copy" in r["us"] and any(n.startswith("t") and "_wg" in n for n in r["us"]) for r in results)


def _tables(tmp_path, monkeypatch, capsys, variants: str) -> list[str]:
    """The lines --tables prints of two runs of one shape (standing in for wgpu's and Dawn's)."""
    runs = []
    for impl in ("wgpu", "dawn"):
        out = tmp_path / f"probe-{impl}.json"
        monkeypatch.setattr(sys, "argv", ["probe_half_floor.py", "--json", str(out), "--shapes", "8x256",
                                          "--dtypes", "float16", "--rounds", "1", "--repeats", "2",
                                          "--variants", variants])
        probe.main()
        runs.append(str(out))
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["probe_half_floor.py", "--tables", ",".join(runs)])
    probe.main()
    return capsys.readouterr().out.splitlines()


def test_tables_name_each_shape_and_its_best_layouts(tmp_path, monkeypatch, capsys):
    lines = _tables(tmp_path, monkeypatch, capsys, "kernel,grid,floor_grid,half_threads,prefetch2")
    best = [line for line in lines if line.startswith("| 8x256 (16x4) | t16_wg64 / t16_wg64 |")]
    halved = [line for line in lines if line.startswith("| 8x256 | 16x4 | 128 |")]
    turns = [line for line in lines if line.startswith("| 8x256 | ") and line.count("/") == 3]
    assert len(best) == 1 and len(halved) == 1 and len(turns) == 1, lines
    # Both runs' layouts: the kernel's, its best, the floor's in the kernel's and its best.
    assert best[0].count("_wg") == 8
    assert "| shape | kernel | best layout | prefetch2 |" in lines


def test_the_16_byte_table_sets_each_form_beside_the_kernel_and_the_floors(tmp_path, monkeypatch, capsys):
    lines = _tables(tmp_path, monkeypatch, capsys, "kernel,floor_kernel,wide,floor_wide")
    assert lines[0] == ("| shape | kernel (table) | exact floor, kernel's layout | wide, best layout "
                        "| floor_wide, best layout | wide over the kernel | better form over the better floor |")
    (row,) = [line for line in lines if line.startswith("| 8x256 |")]
    # Each form's best layout named on both runs, and every cell a pair.
    assert row.count("_wg") == 4 and row.count(" / ") == 6, row
