"""Atomic writes: readers see the old file or the whole new one; a failure leaves no debris."""

import json
import os
import stat

import pytest

from pipeline import ioutil


def test_write_json_atomic_creates_folders_with_a_plain_file_mode(tmp_path):
    path = tmp_path / "a" / "b.json"
    ioutil.write_json_atomic(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "model.pte"
    path.write_bytes(b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(ioutil.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        ioutil.write_bytes_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pte"]


def test_output_paths_are_checked_before_work(tmp_path):
    (tmp_path / "file").write_text("")
    ioutil.check_output_file(tmp_path / "new" / "deeper" / "b.json")
    ioutil.check_output_dir(tmp_path / "new" / "deeper")
    with pytest.raises(ValueError, match="is not a directory"):
        ioutil.check_output_file(tmp_path / "file" / "b.json")
    with pytest.raises(ValueError, match="is a directory, not a file"):
        ioutil.check_output_file(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        ioutil.check_output_dir(tmp_path / "file")
    assert not (tmp_path / "new").exists()  # checking creates nothing
