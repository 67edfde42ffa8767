"""A damaged, foreign or moving file is refused with a reason by both runtimes: never a
crash, never a silently different answer beyond what README says no check can see.

Cases that could crash run in a worker process (`support/damage.py`), so a crash fails the case
instead of the test run.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.pte.file import PteFile
from support.damage import damage, sweep

pytestmark = pytest.mark.usefixtures("gpu_info")

RUNTIMES = ("python", "executorch")


@pytest.fixture(scope="module")
def small(small_block):
    """A linear, an affine LayerNorm, a GroupNorm: the file and its inputs, saved."""
    _, inputs, program, pte, inputs_file = small_block
    return pte, inputs_file, program, inputs


def _set(at: int, fmt: str, value) -> str:
    return f"set {at} {struct.pack(fmt, value).hex()}"


def _crash_cases(data: bytes) -> dict[str, str]:
    """Files whose damage ExecuTorch's runtime does not check (it crashed on them)."""
    at = _kernel_call_field(data, 0)
    name = data.index(b"aten::addmm") + 7
    return {
        "identifier not UTF-8": "set 4 fffe8081",  # ExecuTorch's log of it aborted the process
        "operator index 2^26 + k": _set(at, "<i", struct.unpack_from("<i", data, at)[0] | 1 << 26),
        "operator name not UTF-8": f"set {name} {bytes([data[name] | 0x80]).hex()}",  # a lone continuation byte
        "random bytes": "garbage 7 4096",
    }


def _kernel_call_field(data: bytes, pc: int) -> int:
    """Where instruction `pc`'s operator index lies in the file."""
    from executorch.exir._serialize.generated.executorch_flatbuffer.KernelCall import KernelCall
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program

    program = Program.GetRootAs(data, 0)
    table = program.ExecutionPlan(0).Chains(0).Instructions(pc).InstrArgs()
    call = KernelCall()
    call.Init(table.Bytes, table.Pos)
    return call._tab.Pos + call._tab.Offset(4)


class _Fields:
    """Where fields of the program flatbuffer lie in a file, to change them in place."""

    def __init__(self, data: bytes) -> None:
        from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program

        self.data = data
        self.plan = Program.GetRootAs(data, 0).ExecutionPlan(0)

    def value(self, j: int):
        return self.plan.Values(j).Val()

    def instruction(self, pc: int):
        return self.plan.Chains(0).Instructions(pc).InstrArgs()

    @staticmethod
    def scalar(table, slot: int) -> int:
        return table.Pos + table.Offset(slot)

    @staticmethod
    def item(table, slot: int, j: int, size: int) -> int:
        return table.Vector(table.Offset(slot)) + j * size

    @staticmethod
    def table(table, slot: int):
        from flatbuffers.table import Table

        return Table(table.Bytes, table.Indirect(table.Pos + table.Offset(slot)))


# Slots of the schema's tables (program.fbs field order).
TENSOR_SCALAR_TYPE, TENSOR_SIZES, TENSOR_ALLOCATION = 4, 8, 16
ALLOCATION_OFFSET_LOW = 6
KERNEL_CALL_ARGS = 6


def _inconsistent_cases(data: bytes) -> dict[str, str]:
    """Programs whose parts contradict each other (single changes, as bit flips make them)."""
    from executorch.exir import schema

    plan = PteFile(data, "x").plan
    fields = _Fields(data)
    tensors = {j: v.val for j, v in enumerate(plan.values) if isinstance(v.val, schema.Tensor)}
    planned = [j for j, t in tensors.items() if t.allocation_info is not None and t.sizes]
    constant = next(j for j, t in tensors.items() if t.data_buffer_idx > 0)
    relu = next(pc for pc, i in enumerate(plan.chains[0].instructions) if isinstance(i.instr_args, schema.KernelCall)
                and plan.operators[i.instr_args.op_index].name == "aten::relu")
    relu_input = plan.chains[0].instructions[relu].instr_args.args[0]
    other = next(j for j in planned if tensors[j].sizes != tensors[relu_input].sizes)
    allocation = fields.table(fields.value(relu_input), TENSOR_ALLOCATION)
    last = planned[-1]
    return {
        # a size changed (6 -> 134 in the report): what the operator makes disagrees with it
        "a size": _set(fields.item(fields.value(last), TENSOR_SIZES, 0, 8), "<q", tensors[last].sizes[0] + 128),
        # an operator's input re-pointed at a tensor of another shape
        "an argument": _set(fields.item(fields.instruction(relu), KERNEL_CALL_ARGS, 0, 4), "<i", other),
        # a constant's dtype changed: it no longer fills its slot in the constant segment
        "a dtype": _set(fields.scalar(fields.value(constant), TENSOR_SCALAR_TYPE), "<b", 7),
        # a tensor moved over another one that is live at the same time
        "an offset": _set(fields.scalar(allocation, ALLOCATION_OFFSET_LOW), "<I",
                          tensors[relu_input].allocation_info.memory_offset_low + 16),
    }


def _sweep_cases(data: bytes) -> list[str]:
    """Single-bit flips over the whole file (every 6th byte, the bit moving), truncations
    at 40 places, random files with and without the identifier."""
    size = len(data)
    cases = [f"flip {offset} {(offset // 6) % 8}" for offset in range(0, size, 6)]
    cases += [f"cut {cut}" for cut in sorted({0, 4, 7, 8, 31, 32, *range(40, size, max(1, size // 34))})]
    cases += [f"random {seed} {64 + seed * 97}" for seed in range(12)]
    cases += [f"garbage {seed} {8 + seed * 61}" for seed in range(6)]
    return cases


@pytest.fixture(scope="module")
def outcomes(small):
    """Every case's outcome in each runtime, one worker process a runtime (a crash costs a
    worker, not the test run)."""
    pte, inputs, _, _ = small
    data = pte.read_bytes()
    cases = [*_crash_cases(data).values(), *_inconsistent_cases(data).values(), "zeros 64", "fifo",
             "truncated-while-loaded", "overwritten-while-loaded", *_sweep_cases(data)]
    runtimes = ["python"]
    from pipeline.native import build

    try:
        build.find_compiler()
        build.build()  # here, not in both workers at once
        runtimes.append("executorch")
    except build.BuildError as exc:
        missing = str(exc)
    found: dict[str, dict[str, str]] = {}
    with ThreadPoolExecutor(len(runtimes)) as pool:  # one worker a runtime, side by side
        for runtime, result in zip(runtimes, pool.map(lambda r: sweep(r, pte, inputs, cases), runtimes)):
            found[runtime] = result

    def run(runtime: str) -> dict[str, str]:
        if runtime not in found:
            pytest.skip(missing)
        return found[runtime]
    return run


def _refused_load(outcome: str) -> bool:
    return outcome.startswith("refused-load PteError")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_files_that_crashed_executorch_are_refused_by_both(small, outcomes, runtime):
    got = outcomes(runtime)
    for name, case in _crash_cases(small[0].read_bytes()).items():
        assert _refused_load(got[case]), f"{runtime}, {name}: {got[case]}"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_inconsistent_programs_are_refused_at_load(small, outcomes, runtime):
    got = outcomes(runtime)
    for name, case in _inconsistent_cases(small[0].read_bytes()).items():
        assert _refused_load(got[case]), f"{runtime}, {name}: {got[case]}"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_empty_program_is_a_value_error(outcomes, runtime):
    # 64 zero bytes with the identifier: the flatbuffer reader finds no tables at all.
    assert _refused_load(outcomes(runtime)["zeros 64"]), outcomes(runtime)["zeros 64"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_named_pipe_is_refused_without_blocking(outcomes, runtime):
    outcome = outcomes(runtime)["fifo"]
    assert _refused_load(outcome) and "named pipe" in outcome, outcome


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("change", ["truncated-while-loaded", "overwritten-while-loaded"])
def test_a_loaded_program_does_not_see_its_file_change(outcomes, runtime, change):
    assert outcomes(runtime)[change] == "same", outcomes(runtime)[change]


# What no check can see without a checksum (README): a scalar argument, an output or
# argument re-pointed at a tensor of the same shape and dtype, an instruction turned into
# another whose shapes all agree, and constant data.
UNDETECTABLE = (r"\.val\.(int_val|double_val|bool_val)$", r"\.outputs\[\d+\]$", r"\.instr_args\.args\[\d+\]$",
                r"\.instr_args$")


def _changes(before, after, path: str = "") -> list[str]:
    if dataclasses.is_dataclass(before) and type(before) is type(after):
        return [c for f in dataclasses.fields(before)
                for c in _changes(getattr(before, f.name), getattr(after, f.name), f"{path}.{f.name}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [c for i, (b, a) in enumerate(zip(before, after)) for c in _changes(b, a, f"{path}[{i}]")]
    return [] if before == after else [path]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_damaged_file_sweep_never_crashes_or_silently_changes(small, outcomes, runtime):
    pte, _, _, _ = small
    data = pte.read_bytes()
    original = PteFile(data, "intact").program
    constants = PteFile(data, "intact").segments[original.constant_segment.segment_index]
    got = outcomes(runtime)
    cases = _sweep_cases(data)
    kinds = {}
    for case in cases:
        outcome = got[case]
        assert not outcome.startswith("crash"), f"{runtime}, {case}: {outcome}"
        if outcome.startswith("refused"):
            # A refusal is a ValueError (PteError) at load, or, for a file that declares
            # other input shapes than the caller's, the input check's at the call.
            assert outcome.startswith(("refused-load PteError", "refused-call ValueError", "refused-call TypeError")), \
                f"{runtime}, {case}: {outcome}"
        elif outcome == "different":
            offset = int(case.split()[1])
            assert case.startswith("flip")
            if not constants.start <= offset < constants.start + constants.size:
                changed = _changes(original, PteFile(damage(data, case), "damaged").program)
                assert changed and all(any(re.search(p, c) for p in UNDETECTABLE) for c in changed), \
                    f"{runtime}, {case}: {changed}"
        kinds[outcome.split(" ")[0]] = kinds.get(outcome.split(" ")[0], 0) + 1
    assert kinds.get("refused-load", 0) > len(cases) // 2, kinds


def test_run_pte_and_reports_refuse_a_named_pipe(tmp_path):
    import json
    import os

    from pipeline.evaluation.artifact import ArtifactError, read_artifact, run_artifact

    fifo = tmp_path / "model.pte"
    os.mkfifo(fifo)
    (tmp_path / "model.coverage.json").write_text(json.dumps({"pte_sha256": "0" * 64}))
    with pytest.raises(ArtifactError, match="not a regular file"):
        run_artifact(fifo)
    with pytest.raises(ArtifactError, match="not a regular file"):
        read_artifact(fifo)  # what the --pte reports read first
