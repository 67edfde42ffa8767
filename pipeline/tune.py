"""Tuning the kernel's layouts on this device: each launch's rule config against the same
rows at half and twice its threads per row and in workgroups of 64, 128 and 256, and plain
half rows also read in 16-byte words at a quarter to twice its threads per row, timed in
interleaved rounds on the GPU's clock; the layouts that beat the rule by at least
`min_gain` make the table (pipeline.wgsl.layouts) that PIPELINE_LAYOUTS points both
runtimes at. scripts/tune_layouts.py is the command line. `program_launches` lists the
launches a program makes, so that a model's own are tuned.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pipeline.benchmark import candidate_configs, time_kernel
from pipeline.blob import NONE
from pipeline.runtime.device import gpu
from pipeline.wgsl.config import KernelConfig
from pipeline.wgsl.layouts import Launch, Layout, Layouts, unusable

if TYPE_CHECKING:  # the tuning itself needs no ExecuTorch: scripts quiet its imports first
    from pipeline.interpreter import Program

# A layout enters the table only where the rule's time over its time is at least this: the
# H200's round-to-round spread of one launch is about 1% (docs/measurements.md), and a
# layout the rule already ties is not worth a line.
MIN_GAIN = 1.02


def candidates(rule: KernelConfig) -> list[KernelConfig]:
    """`rule` first, then those of `bench_layer_norm --sweep`'s candidates a table can hold:
    its rows held at half, the same and twice its threads per row, in workgroups of 64 to
    256; then, where they fit, its rows read in 16-byte words at a quarter, half, the same and
    twice its threads per row, in the same workgroups (`layouts.unusable` says which). A
    quarter: a word holds two of the rule's loads (on the H200 the best words took the rule's
    threads or half as many; docs/measurements.md, "Layouts tuned on the device")."""
    held = [c for c in candidate_configs(rule)[1:] if c.hold and unusable(rule, c.threads_per_row, c.workgroup) is None]
    words = [rule.relaid(threads, workgroup, wide_words=True)
             for threads in (rule.threads_per_row // 4, rule.threads_per_row // 2, rule.threads_per_row,
                             2 * rule.threads_per_row)
             for workgroup in (64, 128, 256) if unusable(rule, threads, workgroup, wide_words=True) is None]
    return [rule, *held, *words]


def tune(launches: Sequence[Launch], rounds: int = 3, repeats: int = 100, min_gain: float = MIN_GAIN,
         progress: Callable[[str], None] = print) -> Layouts:
    """The table of `launches` on this process's device: for each held launch, the
    candidate with the least mean time over `rounds` interleaved rounds of `repeats`
    launches each, where it beats the rule's by `min_gain` or more."""
    if rounds < 1 or repeats < 1:
        raise ValueError(f"rounds and repeats must be at least 1, got {rounds} and {repeats}")
    g = gpu()
    if "timestamp-query" not in g.features:
        raise RuntimeError(f"{g.impl.info['adapter']} ({g.impl.name}) has no timestamp queries: layouts are "
                           "tuned on the GPU's clock, and wall-clock times of one launch cannot tell them apart")
    table = Layouts(g.impl.info["adapter"], g.impl.name)
    for n, launch in enumerate(launches, 1):
        label = f"[{n}/{len(launches)}] {launch.norm} {launch.dtype} {launch.rows}x{launch.width}"
        rule = launch.rule(g.subgroup_size, g.pack2x16float)
        configs = candidates(rule)
        if len(configs) == 1:
            progress(f"{label}: rows streamed, the rule's layout kept")
            continue
        times: list[list[float]] = [[] for _ in configs]
        for r in range(rounds):
            order = list(range(len(configs)))[:: 1 if r % 2 == 0 else -1]
            timed, _ = time_kernel(launch.rows, launch.width, [configs[i] for i in order], repeats=repeats,
                                   dtype=launch.dtype, stats=launch.write_stats, rms=launch.norm == "rms_norm")
            for i, (batched, _isolated) in zip(order, timed):
                times[i].append(batched)
        means = [statistics.mean(t) for t in times]
        best = min(range(1, len(configs)), key=means.__getitem__)  # the best layout other than the rule's
        gain = means[0] / means[best]
        chosen = configs[best]
        if gain >= min_gain:
            table.entries[launch] = Layout(chosen.threads_per_row, chosen.workgroup, chosen.wide_words, round(gain, 3))
            progress(f"{label}: {chosen.threads_per_row} threads a row in workgroups of {chosen.workgroup}"
                     f"{', in 16-byte words' if chosen.wide_words else ''}, {gain:.3f}x the rule's speed "
                     f"({means[0]:.2f} -> {means[best]:.2f} us)")
        else:
            progress(f"{label}: the rule's {rule.threads_per_row} threads a row in workgroups of "
                     f"{rule.workgroup} kept (the best other layout {gain:.3f}x)")
    return table


def program_launches(program: Program, inputs: tuple) -> list[Launch]:
    """The launches `program` (pipeline.load's) makes when it runs `inputs`: each delegate
    call's dtypes, affine parts, stats, width, rows and norm, once each, in the order they ran."""
    params = dict(zip(program.delegate_names, (d.params for d in program.delegates)))
    found: dict[Launch, None] = {}

    def record(name: str, args: tuple, _outputs: tuple) -> None:
        p = params[name]
        x = args[p.input_index]
        width = math.prod(p.resolve(tuple(x.shape)))
        rows = x.numel() // width if width else 0
        if rows:
            found.setdefault(Launch(p.dtype, p.affine_dtype, p.weight.source != NONE, p.bias.source != NONE,
                                    p.stats, width, rows, "rms_norm" if p.op == "rms_norm" else "layer_norm"), None)

    program(*inputs, on_delegate=record)
    return list(found)
