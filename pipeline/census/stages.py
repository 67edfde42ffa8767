"""One architecture through the census's stages, in this process, stopping at the first failure.

    build        tiny config, module and inputs (`pipeline.models.hf`)
    eager        eager float32 forward, counting the LayerNorm/GroupNorm calls by kind (RMSNorms
                 and hand-written LayerNorms run as plain ops: found in the graph instead)
    export       torch.export
    executorch   the control: the same ExportedProgram lowered by ExecuTorch alone (no
                 partitioner), serialized and run in ExecuTorch's runtime; where it fails to
                 view an attention output, again with the copies our lowering then adds too
                 (`pipeline.aot.lowering.to_edge`: GPT-2 and its kin at a batch above 1)
    partitioner  `pipeline.lower` up to the edge program: our graph passes, LayerNormPartitioner
    preprocess   WebGPUBackend.preprocess (within the partitioner's call, told apart by where
                 the failure was raised): the delegate blobs, each decoded back
    runtime      the rest of `pipeline.lower` (the program serialized, those bytes read by our
                 Python runtime) and the program run
    native       the same bytes in ExecuTorch's runtime with our native backend
    coverage     every norm found is delegated (LayerNorm, GroupNorm, RMSNorm, hand-written
                 LayerNorm), and no chain that looks like a norm is left on the CPU
    accuracy     each output against eager float64: at most twice eager float32's error

A failure in the first four is not ours (the model zoo, PyTorch or ExecuTorch): the control
passing is what makes the stages after it ours. With control "on-failure" the control runs only
where a verdict needs it, after our stages: where one of them fails (a control that fails too
makes the failure its own, not ours) or an output misses the accuracy rule with eager as the
only yardstick (the rule is then applied again with the control's). Whose each failure is
stays as with the control first; a row that passes records the control as skipped (one whose
control alone would fail is then ok). So is an output that misses the accuracy rule
where the exported program itself, run by torch, misses it as well: export traced another
computation than eager ran (ExportDiffers). A stage may be skipped with its reason (the
native library not built, no float64 reference) without failing.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable

STAGES = ("build", "eager", "export", "executorch", "partitioner", "preprocess", "runtime", "native", "coverage",
          "accuracy")
OUR_STAGES = STAGES[STAGES.index("partitioner"):]
CONTROLS = ("first", "on-failure")  # when the control runs: in its place, or where a verdict needs it
CAUSE_CHARS = 300
# The accuracy rule's floor, for outputs where eager float32 is exact (its error 0): one
# float32 rounding (machine epsilon) at the output's magnitude, at least 1.
ABSOLUTE_FLOOR = 2.0**-23
# Causes that mean the process ran out of the memory it was allowed.
_OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", "std::bad_alloc", "Cannot allocate memory")


def check_control(control: str) -> None:
    if control not in CONTROLS:
        raise ValueError(f"control must be one of {', '.join(CONTROLS)}, got {control!r}")


class Skipped(Exception):
    """A stage that cannot run here, with the reason; not a failure."""


class CoverageError(Exception):
    """Some norm of the program stays outside the WebGPU delegate."""


class AccuracyError(Exception):
    """An output of the program is further from eager float64 than the rule allows."""


class ExportDiffers(AccuracyError):
    """An output misses the rule in the exported program run by torch as in ours: what export
    traced computes something other than eager (a model whose code takes another path under
    tracing). Not ours."""


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, trimmed to CAUSE_CHARS; the graph node and traceback that
    torch.fx appends to an exception raised while it interprets a graph are left out."""
    message = re.split(r"\n\s*(?:While executing|Original traceback)", str(exc), maxsplit=1)[0]
    text = f"{type(exc).__name__}: {' '.join(message.split())}".rstrip(": ")
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS - 3] + "..."


def out_of_memory(cause: str) -> bool:
    return any(mark in cause for mark in _OUT_OF_MEMORY)


def split_name(name: str) -> tuple[str, str | None]:
    """("clip", "vision_model") for a tower's row "clip.vision_model"; (name, None) otherwise."""
    model_type, _, tower = name.partition(".")
    return model_type, tower or None


class Census:
    """Runs the stages for one row (`name`: a model_type, or "model_type.tower"); `enter(stage)`
    is called as each stage starts, before its work (the worker writes it to its progress file).
    `record` holds the result as the stages go."""

    def __init__(self, name: str, enter: Callable[[str], None] = lambda stage: None, seed: int = 0,
                 control: str = "first") -> None:
        check_control(control)
        self.name = name
        self.seed = seed
        self._deferring = control == "on-failure"
        self._enter_hook = enter
        self.stage: str | None = None
        self._started = 0.0
        # The control's outputs (ExecuTorch alone): the accuracy rule's second yardstick.
        self.control_outputs: list | None = None
        self.record: dict = {"name": name, "status": "ok", "reached": None, "failed_stage": None, "cause": None,
                             "ours": False, "stages": {}}

    def run(self) -> dict:
        """All stages in order until one fails; returns the record (status "ok", "failed" or "oom")."""
        start = time.perf_counter()
        failure = self._through(STAGES)
        if failure is not None and self._deferring and failure[0] in OUR_STAGES:
            failure = self._control_late(*failure)
        if failure is not None:  # any failure is the finding: its stage and one line
            stage, exc = failure
            cause = one_line(exc)
            self.record.update(status="oom" if out_of_memory(cause) else "failed", failed_stage=stage, cause=cause,
                               ours=stage in OUR_STAGES and not isinstance(exc, ExportDiffers))
        self.record["seconds"] = round(time.perf_counter() - start, 3)
        return self.record

    def _through(self, stages) -> tuple[str, Exception] | None:
        """`stages` in order until one fails: (that stage, its exception), or None."""
        for stage in stages:
            self._enter(stage)  # already entered when the stage before reached it (preprocess)
            try:
                if stage == "executorch" and self._deferring:
                    raise Skipped("run only where a verdict needs it (control on-failure), and none did")
                getattr(self, f"_{stage}")()
            except Skipped as why:
                self._close("skipped", str(why))
            except Exception as exc:
                self._close("failed", one_line(exc))
                return self.stage, exc
        self._close("ok")
        return None

    def _control_late(self, stage: str, exc: Exception) -> tuple[str, Exception] | None:
        """The control, run after `exc` ended our `stage` (control "on-failure"): the row's
        failure is the control's where it fails too; where it passes, an accuracy failure is
        judged again with its yardstick. The row's failure, or None."""
        self._deferring = False
        reached = self.record["reached"]
        del self.record["stages"]["executorch"]  # skipped in its place
        control = self._through(["executorch"])
        self.record["stages"] = {s: self.record["stages"][s] for s in STAGES if s in self.record["stages"]}
        if control is not None:
            self.record["reached"] = "export"  # as with the control first
            return control
        self.record["reached"] = reached
        if stage != "accuracy" or not isinstance(exc, AccuracyError):
            return stage, exc
        del self.record["stages"]["accuracy"]
        self.record.pop("exported_accuracy", None)
        return self._through(["accuracy"])

    def _enter(self, stage: str) -> None:
        if self.stage == stage:
            return
        self._close("ok")
        self.stage = stage
        self._started = time.perf_counter()
        self._enter_hook(stage)

    def _close(self, status: str, reason: str | None = None) -> None:
        """Record the current stage's end, once."""
        if self.stage is None or self.stage in self.record["stages"]:
            return
        entry = {"status": status, "seconds": round(time.perf_counter() - self._started, 3)}
        if reason is not None:
            entry["reason" if status == "skipped" else "cause"] = reason
        self.record["stages"][self.stage] = entry
        if status != "failed":
            self.record["reached"] = self.stage

    # -- the stages, in order -------------------------------------------------------------

    def _build(self) -> None:
        import torch

        from pipeline.models import hf

        model_type, tower = split_name(self.name)
        torch.manual_seed(self.seed)
        spec = hf.from_config(hf.tiny_config(model_type), seed=self.seed, name=model_type)
        if tower is not None:
            named = {t.name: t for t in hf.towers(spec)}  # "clip.vision_model"
            if self.name not in named:
                raise ValueError(f"{model_type} has no tower {tower!r} (its towers: {', '.join(named) or 'none'})")
            spec = named[self.name]
        else:
            try:
                self.record["towers"] = [t.name for t in hf.towers(spec)]
            except Exception as exc:  # the row itself still counts; the towers' failure is noted
                self.record["towers_error"] = one_line(exc)
        self.spec = spec
        self.inputs = tuple(spec.example_inputs)
        self.record["inputs"] = [_describe(x) for x in self.inputs]
        self.record["parameters"] = sum(p.numel() for p in spec.module.parameters())

    def _eager(self) -> None:
        from torch.utils._pytree import tree_leaves

        from pipeline.evaluation.eager import run_eager

        run = run_eager(self.spec.module, self.inputs, keep_tensors=False)
        self.eager_outputs = list(tree_leaves(run.outputs))
        self.eager_calls = run.calls
        self.record["outputs"] = [_describe(x) for x in self.eager_outputs]

    def _export(self) -> None:
        import torch

        self.exported = torch.export.export(self.spec.module, self.inputs)

    def _executorch(self) -> None:
        from executorch.runtime import Runtime

        from pipeline.aot.lowering import to_edge

        manager = to_edge(copy.deepcopy(self.exported), []).to_executorch()
        method = Runtime.get().load_program(manager.buffer).load_method("forward")
        outputs = method.execute(list(self.inputs))
        self.record["control_vs_eager_max_abs"] = _max_abs(outputs, self.eager_outputs)
        self.control_outputs = _leaves(outputs)

    def _partitioner(self) -> None:
        """`pipeline.lower`'s first half (`lower_to_edge`: export, graph passes, partitioner, and
        the preprocessing that ExecuTorch does as it makes each partition). A failure whose
        traceback passes through WebGPUBackend.preprocess or the blob is preprocess's."""
        from pipeline.aot.lowering import lower_to_edge

        try:
            self.edge, self.coverage = lower_to_edge(self.spec.module, self.inputs)
        except Exception as exc:
            if _raised_in(exc, _PREPROCESS_FILES):
                self._enter("preprocess")
            raise

    def _preprocess(self) -> None:
        """WebGPUBackend.preprocess ran in the partitioner's call: its blobs are checked here,
        decoded as both runtimes will."""
        from executorch.exir.lowered_backend_module import LoweredBackendModule

        from pipeline.aot.preprocess import WebGPUBackend
        from pipeline import blob

        for lowered in self.edge.exported_program().graph_module.children():
            if isinstance(lowered, LoweredBackendModule) and lowered.backend_id == WebGPUBackend.__name__:
                blob.decode(lowered.processed_bytes)

    def _runtime(self) -> None:
        """The rest of `pipeline.lower` (as it does it): serialize, read those bytes into our
        runtime, run them."""
        import torch

        from pipeline.aot.lowering import _delegate_names
        from pipeline.interpreter.program import Program
        from pipeline.pte.file import PteFile

        pte = PteFile(copy.deepcopy(self.edge).to_executorch().buffer, f"<{self.name}>")
        self.program = Program(pte, coverage=self.coverage, delegate_names=_delegate_names(self.edge, pte),
                               edge=self.edge)
        in_file = sum(site.delegated for site in self.program.layer_norm_sites)
        if in_file != self.coverage.delegated:
            raise RuntimeError(f"the serialized program holds {in_file} delegated norms, the edge program "
                               f"{self.coverage.delegated}")
        with torch.no_grad():
            self.outputs = _leaves(self.program(*self.inputs))
        if len(self.outputs) != len(self.eager_outputs):
            raise RuntimeError(f"the program returns {len(self.outputs)} outputs, eager {len(self.eager_outputs)}")

    def _native(self) -> None:
        import pipeline.native
        from pipeline.native.build import BuildError

        try:
            pipeline.native.register()
        except BuildError as exc:
            raise Skipped(f"the native library is not built: {one_line(exc)}") from None
        outputs = pipeline.native.NativeProgram(self.program.buffer, source=f"{self.name}.pte")(*self.inputs)
        self.record["native_vs_python_max_abs"] = _max_abs(outputs, self.outputs)

    def _coverage(self) -> None:
        from pipeline.evaluation.coverage import program_records

        coverage = self.program.coverage
        kinds: dict[str, dict[str, int]] = {}
        for call in self.eager_calls:
            kinds.setdefault(call.op, {"eager": 0, "graph": 0, "delegated": 0})["eager"] += 1
        for rec in program_records(self.program, self.eager_calls):
            entry = kinds.setdefault(rec.origin, {"eager": 0, "graph": 0, "delegated": 0})
            entry["graph"] += 1
            entry["delegated"] += int(rec.delegated)
        # LayerNorms whose output nothing uses: lowering removes them (where Coverage lists them).
        dead = [f"{node} ({path or '<root>'})" for node, path in getattr(coverage, "dead", ())]
        self.record["coverage"] = {"total": coverage.total, "delegated": coverage.delegated,
                                   "not_delegated": [f"{node}: {reason}" for node, reason in coverage.not_delegated],
                                   "dead": dead, "eager_calls": len(self.eager_calls), "by_kind": kinds}
        if not coverage.complete:
            first = coverage.not_delegated[0] if coverage.not_delegated else ("", "")
            raise CoverageError(f"{coverage.delegated}/{coverage.total} norms delegated; "
                                f"{first[0]}: {first[1]}")

    def _accuracy(self) -> None:
        import torch

        try:
            module64 = copy.deepcopy(self.spec.module).double()
            inputs64 = tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                             for x in self.inputs)
            with torch.no_grad():
                reference = _leaves(module64(*inputs64))
        except Exception as exc:  # some models cannot run in float64: no reference, no verdict
            raise Skipped(f"eager float64 fails: {one_line(exc)}") from None
        if len(reference) != len(self.outputs):
            raise Skipped(f"eager float64 returns {len(reference)} outputs, float32 {len(self.outputs)}")
        control = self.control_outputs
        if control is None or len(control) != len(self.outputs):
            control = [None] * len(self.outputs)
        rows = [output_error(i, got, eager, ref, ctl) for i, (got, eager, ref, ctl)
                in enumerate(zip(self.outputs, self.eager_outputs, reference, control))]
        self.record["accuracy"] = rows
        bad = [row for row in rows if not row["ok"]]
        if not bad:
            return
        row = bad[0]
        exported = self._exported_error(row["index"], reference)
        if exported is not None and not exported["ok"]:
            self.record["exported_accuracy"] = exported
            raise ExportDiffers(f"output {row['index']}: {row['why']}; the exported program run by torch too: "
                                f"max abs error {exported['max_abs']:.3g}")
        raise AccuracyError(f"output {row['index']}: {row['why']}")

    def _exported_error(self, index: int, reference: list) -> dict | None:
        """The rule applied to output `index` of the exported program (torch.export's, before any
        pass of ours) run by torch; None when it cannot run."""
        import torch

        try:
            with torch.no_grad():
                outputs = _leaves(self.exported.module()(*self.inputs))
        except Exception:  # no verdict on export: the failure stays ours
            return None
        if len(outputs) != len(self.eager_outputs):
            return None
        return output_error(index, outputs[index], self.eager_outputs[index], reference[index])


# Where a failure inside lowering is preprocess's: our backend's preprocess and the blob format.
_PREPROCESS_FILES = ("pipeline/aot/preprocess.py", "pipeline/blob.py")


def _raised_in(exc: BaseException, files: tuple[str, ...]) -> bool:
    """Whether `exc`'s traceback, or that of an exception it was raised from, passes through `files`."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(files):
                return True
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return False


def output_error(index: int, got, eager, reference, control=None) -> dict:
    """One output held against eager float64: max abs error (and relative to the output's
    largest magnitude) of the program and of eager float32; ok iff NaN only where eager is NaN
    and the program's error is at most twice the yardstick's plus ABSOLUTE_FLOOR x max(1,
    magnitude). The yardstick is eager float32, or the control (the same export lowered by
    ExecuTorch alone, `control`) where the control's error is the larger: what our delegate
    adds is held against what the same program costs without it. Eager alone is a yardstick
    that luck can make too close (chinese_clip's logits: four values a few float32 units off,
    eager 6.8e-07, the control 1.4e-06, ours 2.0e-06). Non-floating outputs must equal eager's."""
    import torch

    row: dict = {"index": index, "shape": list(getattr(got, "shape", [])),
                 "dtype": str(getattr(got, "dtype", "")).removeprefix("torch.")}
    if not isinstance(got, torch.Tensor) or not got.is_floating_point():
        same = isinstance(got, torch.Tensor) and isinstance(eager, torch.Tensor) and torch.equal(got, eager)
        same = same or (not isinstance(got, torch.Tensor) and got == eager)
        return {**row, "ok": bool(same), **({} if same else {"why": "differs from eager (not floating point)"})}
    if got.shape != eager.shape or reference.shape != eager.shape:
        return {**row, "ok": False, "why": f"shape {list(got.shape)}, eager {list(eager.shape)}"}
    g, e, r = (t.detach().reshape(-1).to(torch.float64) for t in (got, eager, reference))
    if not torch.equal(torch.isnan(g), torch.isnan(e)):
        count = int((torch.isnan(g) != torch.isnan(e)).sum())
        return {**row, "ok": False, "why": f"NaN at {count} places where eager float32 has none or the reverse"}
    keep = torch.isfinite(r) & torch.isfinite(e)
    scale = float(r[keep].abs().max()) if keep.any() else 0.0
    got_err = _max(torch.where(torch.isnan(g[keep]), math.inf, (g[keep] - r[keep]).abs()))
    eager_err = _max((e[keep] - r[keep]).abs())
    yardstick, control_err = eager_err, None
    if isinstance(control, torch.Tensor) and control.shape == eager.shape and control.is_floating_point():
        c = control.detach().reshape(-1).to(torch.float64)
        # NaN where eager's are (so none where `keep` looks), finite where eager is: else no yardstick.
        err = _max((c[keep] - r[keep]).abs()) if torch.equal(torch.isnan(c), torch.isnan(e)) else math.inf
        if math.isfinite(err):
            control_err = row["control_max_abs"] = err
            yardstick = max(eager_err, control_err)
    limit = 2 * yardstick + ABSOLUTE_FLOOR * max(1.0, scale)
    row.update(max_abs=got_err, eager_max_abs=eager_err, relative=got_err / scale if scale else got_err,
               eager_relative=eager_err / scale if scale else eager_err, limit=limit,
               ratio=got_err / eager_err if eager_err else (0.0 if got_err == 0 else math.inf), ok=got_err <= limit)
    if not row["ok"]:
        control_said = f", the control's {control_err:.3g}" if control_err is not None else ""
        row["why"] = (f"max abs error {got_err:.3g} against float64, over {limit:.3g} "
                      f"(eager float32's {eager_err:.3g}{control_said})")
    return row


def _max(values) -> float:
    return float(values.max()) if values.numel() else 0.0


def _leaves(outputs) -> list:
    from torch.utils._pytree import tree_leaves

    return list(tree_leaves(outputs))


def _max_abs(outputs, reference) -> float | None:
    """The largest difference between two runs' floating-point outputs (None when they do
    not pair up)."""
    import torch

    outputs, reference = _leaves(outputs), _leaves(reference)
    if len(outputs) != len(reference):
        return None
    worst = 0.0
    for a, b in zip(outputs, reference):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point():
            if a.shape != b.shape:
                return None
            diff = (a.detach().to(torch.float64) - b.detach().to(torch.float64)).abs()
            worst = max(worst, _max(torch.nan_to_num(diff, nan=0.0)))
    return worst


def _describe(x) -> str:
    shape = "x".join(str(d) for d in getattr(x, "shape", ()))
    return f"{str(getattr(x, 'dtype', type(x).__name__)).removeprefix('torch.')}[{shape}]"
