"""The census (scripts/census.py, pipeline.census): rows through the stages in processes of their
own, records resumed from census.jsonl, hangs and crashes recorded with their stage, the report,
exit statuses, and the same rows as Ray tasks."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import signal
import sys
from types import SimpleNamespace

import pytest
import torch

from pipeline.census import JSONL, OUR_STAGES, STAGES, read_records
from pipeline.census import pool as census_pool
from pipeline.census import run as census_run
from pipeline.census.stages import Census, Skipped, output_error
from pipeline.census.worker import FAULT_ENV
from support.scripts import run_script

ROWS = ("vit", "deit")  # the quickest rows of the sample


def _census(*args: str) -> tuple[int, str]:
    """scripts/census.py's main in this process (its fork server serves every test here):
    (exit status, stderr)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = census_run.census_main("census", list(args))
    return code, stderr.getvalue()


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    """ROWS censused twice into one folder: (first run, second run, the folder)."""
    out = tmp_path_factory.mktemp("census")
    first = _census(*ROWS, "--jobs", "2", "--output-dir", str(out))
    second = _census(*ROWS, "--jobs", "2", "--output-dir", str(out))
    return first, second, out


def test_rows_pass_every_stage(census):
    (code, stderr), _, out = census
    assert code == 0, stderr
    records = {r["name"]: r for r in read_records(out / JSONL)}
    assert sorted(records) == sorted(ROWS)
    for record in records.values():
        assert record["status"] == "ok" and record["reached"] == "accuracy", record
        assert list(record["stages"]) == list(STAGES)
        assert record["coverage"]["delegated"] == record["coverage"]["total"] > 0
        assert record["coverage"]["by_kind"]["layer_norm"]["delegated"] == record["coverage"]["total"]
        assert all(row["ok"] for row in record["accuracy"])
        assert record["peak_rss_mb"] > 0 and record["seconds"] > 0
    assert "[2/2]" in stderr and "norms delegated" in stderr


def test_second_run_resumes(census):
    _, (code, stderr), out = census
    assert code == 0, stderr
    assert "0 to run" in stderr
    assert len((out / JSONL).read_text().splitlines()) == len(ROWS)


def test_report_files(census):
    _, _, out = census
    data = json.loads((out / "census.json").read_text())
    assert data["population"] == len(ROWS) and data["status"] == {"ok": len(ROWS)}
    assert data["reached"]["accuracy"] == len(ROWS) and data["ours"] == 0
    assert data["norms"]["layer_norm"]["delegated"] > 0
    assert "## Stages" in (out / "census.md").read_text()
    assert (out / "census.html").read_text().startswith("<!DOCTYPE html>")


def test_hang_and_crash_are_recorded_with_their_stage(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "albert:build:hang,vit:eager:crash")
    code, stderr = _census("albert", "vit", "--jobs", "2", "--timeout", "10", "--output-dir", str(tmp_path))
    assert code == 0, stderr  # neither is in our stages
    records = {r["name"]: r for r in read_records(tmp_path / JSONL)}
    hung, crashed = records["albert"], records["vit"]
    assert (hung["status"], hung["failed_stage"], hung["ours"]) == ("timeout", "build", False)
    assert hung["cause"] == "timed out after 10 s"
    assert (crashed["status"], crashed["failed_stage"]) == ("crashed", "eager")
    assert crashed["cause"].startswith("killed by SIGSEGV") and crashed["reached"] == "build"
    assert "timeout at build (not ours)" in stderr


class _Staged(Census):
    """Stages that do nothing but what a test asks: `fail` raises in that stage, `skip` skips it."""

    def __init__(self, fail: str | None = None, skip: str | None = None, control: str = "first",
                 also_fail: str | None = None) -> None:
        super().__init__("fake", control=control)
        self.fail, self.skip, self.also_fail, self.ran = fail, skip, also_fail, []
        for stage in STAGES:
            setattr(self, f"_{stage}", self._maker(stage))

    def _maker(self, stage: str):
        staged = self._staged(stage)

        def work() -> None:
            self.ran.append(stage)
            if stage == self.also_fail:
                raise ValueError(f"{stage} broke too")
            staged()

        return work

    def _staged(self, stage: str):
        def work() -> None:
            if stage == self.fail:
                raise MemoryError() if stage == "export" else ValueError(f"{stage} broke")
            if stage == "partitioner":
                self._enter("preprocess")  # as ExecuTorch preprocesses within the partitioner's call
                if self.fail == "preprocess":
                    raise ValueError("blob")
            if stage == self.skip:
                raise Skipped("not here")

        return work


_VERDICT = ("status", "failed_stage", "cause", "ours")


class _Constant(torch.nn.Module):
    def forward(self, x):
        return 0 * x + torch.tensor([4.0, -2.0])


@pytest.mark.parametrize("stage", [*STAGES, None])
@pytest.mark.parametrize("control_fails", [False, True])
def test_a_control_on_failure_gives_the_verdict_of_the_control_first(stage, control_fails):
    also = "executorch" if control_fails else None
    first = _Staged(fail=stage, also_fail=also).run()
    late = _Staged(fail=stage, also_fail=also, control="on-failure")
    record = late.run()
    if stage in (None, "executorch") and (control_fails or stage == "executorch"):
        # The control alone fails and our stages pass: not ours either way; run late, it is
        # not needed, and the row passes.
        assert (first["failed_stage"], first["ours"]) == ("executorch", False)
        assert (record["status"], record["ours"], record["reached"]) == ("ok", False, "accuracy")
        assert "executorch" not in late.ran
        return
    assert {k: record[k] for k in _VERDICT} == {k: first[k] for k in _VERDICT}
    assert record["reached"] == first["reached"]
    assert list(record["stages"]) == [s for s in STAGES if s in record["stages"]]
    # The control runs after a failure of one of our stages, and only then: a passing row skips it.
    ours_failed = stage in OUR_STAGES
    assert ("executorch" in late.ran) == ours_failed
    if ours_failed:
        assert late.ran[-1] == "executorch" and record["stages"][stage]["status"] == "failed"
    elif stage is None:
        assert record["status"] == "ok" and record["stages"]["executorch"]["status"] == "skipped"
        assert "on-failure" in record["stages"]["executorch"]["reason"]


def test_a_control_on_failure_judges_the_accuracy_rule_again_with_its_yardstick():
    """An output off the rule with eager as the only yardstick, within it with the control's:
    the row passes, as with the control first."""
    census = _Staged(control="on-failure")
    census._accuracy = Census._accuracy.__get__(census)  # the real stage, the outputs faked
    ulp = 2.0**-21  # float32's spacing at 4
    eager, control, got = (torch.tensor([4.0 + k * ulp, -2.0]) for k in (1, 2, 4))
    census.spec = SimpleNamespace(module=_Constant())  # float64's output: [4, -2]
    census.inputs, census.eager_outputs, census.outputs = (torch.zeros(2),), [eager], [got]
    census._executorch = lambda: setattr(census, "control_outputs", [control])
    record = census.run()
    assert record["status"] == "ok" and record["reached"] == "accuracy", record
    assert record["stages"]["executorch"]["status"] == "ok" and record["stages"]["accuracy"]["status"] == "ok"
    assert record["accuracy"][0]["control_max_abs"] == 2 * ulp
    with pytest.raises(ValueError, match="control must be one of first, on-failure"):
        Census("x", control="never")


@pytest.mark.parametrize("stage", STAGES)
def test_first_failing_stage_is_recorded(stage):
    record = _Staged(fail=stage).run()
    assert record["failed_stage"] == stage and record["ours"] == (stage in OUR_STAGES)
    assert record["status"] == ("oom" if stage == "export" else "failed")
    assert list(record["stages"])[-1] == stage and record["stages"][stage]["status"] == "failed"
    assert all(e["status"] == "ok" for s, e in record["stages"].items() if s != stage)


def _raises_in(path: str):
    """A function whose frame lies in `path`, raising there."""
    space: dict = {}
    exec(compile("def lower_to_edge(module, inputs):\n    raise ValueError('no blob')\n", path, "exec"), space)
    return space["lower_to_edge"]


@pytest.mark.parametrize("path, stage", [("/x/pipeline/aot/preprocess.py", "preprocess"),
                                         ("/x/pipeline/blob.py", "preprocess"),
                                         ("/x/pipeline/aot/partitioner.py", "partitioner")])
def test_a_lowering_failure_is_classed_by_where_it_was_raised(path, stage, monkeypatch):
    monkeypatch.setitem(sys.modules, "pipeline.aot.lowering", SimpleNamespace(lower_to_edge=_raises_in(path)))
    census = _Staged()
    census._partitioner = Census._partitioner.__get__(census)  # the real stage, lowering faked
    census.spec, census.inputs = SimpleNamespace(module=None), ()
    record = census.run()
    assert (record["failed_stage"], record["cause"]) == (stage, "ValueError: no blob")


class _TracedOtherwise(torch.nn.Module):
    """Computes one thing in eager and another under torch.export (as Aimv2's text model drops
    its causal mask in eager and keeps it when traced)."""

    def forward(self, x):
        return x + 1 if torch.compiler.is_exporting() else x


@pytest.mark.parametrize("module, ours", [(_TracedOtherwise(), False), (torch.nn.Identity(), True)])
def test_an_output_off_the_rule_is_ours_unless_the_exported_program_is_off_too(module, ours):
    census = _Staged()
    census._accuracy = Census._accuracy.__get__(census)  # the real stage, the program's outputs faked
    x = torch.randn(3, generator=torch.Generator().manual_seed(0))
    census.spec, census.inputs = SimpleNamespace(module=module), (x,)
    census.eager_outputs, census.exported, census.outputs = [module(x)], torch.export.export(module, (x,)), [x + 1]
    record = census.run()
    assert (record["failed_stage"], record["ours"]) == ("accuracy", ours)
    assert record["cause"].startswith("AccuracyError: output 0" if ours else "ExportDiffers: output 0")
    assert ("exported_accuracy" in record) != ours


def test_skipped_stage_is_not_a_failure():
    record = _Staged(skip="native").run()
    assert record["status"] == "ok" and record["reached"] == "accuracy"
    assert record["stages"]["native"] == {"status": "skipped", "seconds": record["stages"]["native"]["seconds"],
                                          "reason": "not here"}


def test_output_error_rule():
    ref = torch.tensor([1.0, 2.0, float("nan")], dtype=torch.float64)
    eager = torch.tensor([1.0, 2.0 + 1e-3, float("nan")])
    assert output_error(0, eager.clone(), eager, ref)["ok"]
    assert not output_error(0, eager + torch.tensor([0.0, 3e-3, 0.0]), eager, ref)["ok"]
    nan_row = output_error(0, torch.tensor([float("nan"), 2.0, float("nan")]), eager, ref)
    assert not nan_row["ok"] and "NaN" in nan_row["why"]
    exact = torch.tensor([1.0, 2.0, 3.0])
    row = output_error(0, exact + 1e-7, exact, exact.double())  # eager exact: the floor
    assert row["ok"] and row["eager_max_abs"] == 0.0 and math.isinf(row["ratio"])
    ids = torch.tensor([1, 2])
    assert output_error(0, ids, ids, ids)["ok"] and not output_error(0, ids + 1, ids, ids)["ok"]


def test_the_yardstick_is_the_control_where_it_errs_more_than_eager():
    """Eager float32 a unit in the last place off, the control (ExecuTorch alone) two, the
    program four: past twice eager's (and the floor's one unit), within twice the control's; a
    control whose NaNs are not eager's, infinite where eager is finite, or of another shape, is
    no yardstick."""
    ref = torch.tensor([4.0, -2.0], dtype=torch.float64)
    ulp = 2.0**-21  # float32's spacing at 4
    eager, control, got = (torch.tensor([4.0 + k * ulp, -2.0]) for k in (1, 2, 4))
    assert not output_error(0, got, eager, ref)["ok"]
    row = output_error(0, got, eager, ref, control)
    assert row["ok"] and row["control_max_abs"] == 2 * ulp and row["eager_max_abs"] == ulp
    assert not output_error(0, got + 2 * ulp, eager, ref, control)["ok"]
    assert "the control's" in output_error(0, got + 2 * ulp, eager, ref, control)["why"]
    for other in (torch.tensor([float("nan"), -2.0]), torch.tensor([float("inf"), -2.0]), torch.zeros(3)):
        assert not output_error(0, got, eager, ref, other)["ok"]


def test_abnormal_end_records_stage_and_signal():
    progress = [{"stage": "build", "t": 0.0}, {"stage": "eager", "t": 1.0}, {"stage": "export", "t": 1.5}]
    record = census_pool._abnormal("x", -signal.SIGSEGV, False, 30, progress, "boom", 4.0, 100.0)
    assert (record["status"], record["failed_stage"], record["reached"]) == ("crashed", "export", "eager")
    assert record["cause"] == "killed by SIGSEGV; output: boom" and record["stages"]["build"]["seconds"] == 1.0
    record = census_pool._abnormal("x", -signal.SIGKILL, True, 30, progress[:1], "", 30.0, None)
    assert (record["status"], record["failed_stage"], record["reached"]) == ("timeout", "build", None)


class _FakePool:
    def __init__(self, records: list[dict]) -> None:
        self.records, self.pending = records, []

    def submit(self, name: str) -> None:
        self.pending.append(name)

    def __len__(self) -> int:
        return len(self.pending)

    def finished(self):
        name = self.pending.pop(0)
        yield next(r for r in self.records if r["name"] == name)

    def close(self) -> None:
        pass


def test_a_failure_in_our_stages_fails_the_census(tmp_path, monkeypatch, capsys):
    ok = {"name": "a", "status": "ok", "reached": "accuracy", "failed_stage": None, "cause": None, "ours": False,
          "stages": {}, "towers": ["a.vision_model"], "seconds": 1.0}
    tower = {**ok, "name": "a.vision_model", "towers": None, "status": "failed", "reached": "preprocess",
             "failed_stage": "runtime", "cause": "CheckError: no", "ours": True}
    monkeypatch.setattr(census_run, "make_pool", lambda *args: _FakePool([ok, tower]))
    monkeypatch.setattr(census_run, "_native_build", lambda: None)
    monkeypatch.setattr(census_run, "start_fork_server", lambda: None)
    lines = []
    assert census_run.run_census(["a"], tmp_path, progress=lines.append) == 1
    assert [r["name"] for r in read_records(tmp_path / JSONL)] == ["a", "a.vision_model"]
    assert "[2/2] a.vision_model: failed at runtime (ours): CheckError: no" in lines[2]
    assert "a.vision_model (runtime)" in capsys.readouterr().err
    data = json.loads((tmp_path / "census.json").read_text())
    assert data["ours"] == 1 and data["causes"][0]["architectures"] == ["a.vision_model"]


def test_a_line_cut_short_is_left_out(tmp_path):
    path = tmp_path / JSONL
    census_run.append_record(path, {"name": "a"})
    with open(path, "a") as f:
        f.write('{"name": "b", "sta')
    census_run.append_record(path, {"name": "c"})
    assert [r["name"] for r in read_records(path)] == ["a", "c"]


def test_a_census_file_that_is_a_named_pipe_is_refused_without_waiting(tmp_path):
    # Before: resuming into an output folder whose census.jsonl was a named pipe waited forever.
    import os

    from pipeline.ioutil import NotRegularFile
    from support.waits import within

    os.mkfifo(tmp_path / JSONL)
    with within(20), pytest.raises(NotRegularFile, match=r"Not a regular file \(a named pipe\)"):
        read_records(tmp_path / JSONL)


def test_a_census_file_larger_than_any_census_is_refused_unread(tmp_path):
    # Before: read whole, whatever its size (a sparse file of 64 GiB would have been).
    from pipeline.census.run import JSONL_MAX_BYTES
    from pipeline.ioutil import FileTooLarge

    with open(tmp_path / JSONL, "wb") as f:
        f.truncate(JSONL_MAX_BYTES + 1)
    with pytest.raises(FileTooLarge, match=f"Larger than {JSONL_MAX_BYTES} bytes"):
        read_records(tmp_path / JSONL)


@pytest.mark.parametrize("args", [["--sample", "bert"], ["no-such-architecture"], ["--jobs", "0"],
                                  ["--timeout", "-1"]])
def test_bad_usage_exits_2(args, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        census_run.census_main("census", [*args, "--output-dir", str(tmp_path)])
    assert exit.value.code == 2


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (the census extra: pip install -e '.[census]')")
def test_rows_as_ray_tasks(tmp_path):
    """The script itself, end to end, on a private Ray instance."""
    row = ROWS[0]  # one row: Ray's start is most of the time
    result = run_script("census", row, "--ray", "local", "--jobs", "1", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    records = read_records(tmp_path / JSONL)
    assert [r["name"] for r in records] == [row]
    assert all(r["status"] == "ok" and r["reached"] == "accuracy" for r in records), records
    assert "Ray local" in result.stderr and "[1/1]" in result.stderr
