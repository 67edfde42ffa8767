"""Issue 15, "measure first": does the kernel lose to a copy (and to torch.compile) because a
one-wave grid loads everything, waits at the row merge and only then stores?

Variants of the product kernel, each checked against float64 before it is timed, interleaved
with the product's own choice in one call (rounds alternate the order), beside the WGSL copy
of the same bytes, torch's layer_norm eager and torch.compile'd (default mode, static
shapes), and torch's copy:

- product            choose_config, as the runtime launches it
- late_affine        weight and bias loaded after the row merge (NOTES "What to try next" 2)
- unclamped_loads    threads past the last row load out of bounds instead of the last row:
                     no load address waits for the row count (a uniform read)
- threads_x2, _x4    2x / 4x the threads per row (half / a quarter of the values each): more,
                     thinner threads, so more waves of work units
- threads_half       half the threads per row (twice the values each): fewer, fatter threads
- workgroup_32       one subgroup's worth of threads a workgroup (fewer rows per workgroup),
                     where the product puts several rows in a workgroup
- persist_T{256,512,1024}  persistent workgroups (benchmarks/wgsl/persistent_rows.wgsl): SMs x
                     T / workgroup of them, rows grid-strided, weight and bias loaded once, the
                     next rows' loads issued before the current rows' merge and store
- persist_serial_T512      the same grid, next rows loaded after the store (the control)
- persist_x2_T{512,1024}   persistent with prefetch at 2x threads per row (half the registers
                     per thread for the two rows in flight)
- no_stats           no mean and rstd stores (what a delegate whose program uses only the
                     output needs; checked on the output alone)
- staged_W{64,128,256,512} weight and bias copied once per workgroup (max(W, threads per row)
                     threads, more rows sharing one copy) into workgroup memory and read from
                     there at the stores: fewer registers per thread, so more resident threads,
                     and weight and bias read from L2 once per workgroup instead of once per row

    OUT=dir python benchmarks/probe_waves.py                 # the H200 shapes: dir/waves_probe.json
    python benchmarks/probe_waves.py --shapes 37x768,1000x128 --repeats 20 --sms 2 --json f.json

The persistent grid needs the SM count: CUDA's when torch sees a GPU, else --sms.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pipeline.benchmark import (
    parse_shapes,
    time_copy,
    time_kernel,
    time_torch,
    time_torch_compiled,
    time_torch_copy,
)
from pipeline.runtime.device import device_info, gpu, read_bytes
from pipeline.runtime.launch import PARAMS_BYTES, STAGING, STORAGE, UNIFORM, compile_pipeline, grid, pack_params
from pipeline.wgsl.config import EACH_HELD_VALUE, KernelConfig, choose_config, written_out

# The model shapes where the kernel loses most to torch.compile (issue 15); the three largest
# first, then the two where a persistent grid takes most turns, so a cut-short call keeps them.
LOSING_SHAPES = "4096x768,1500x384,73728x128,8192x1024,4096x3072,1024x768,9216x256,2304x512,576x1024,1500x768"
PERSISTENT_SOURCE = Path(__file__).with_name("wgsl") / "persistent_rows.wgsl"
EPS = 1e-5


def _edit(source: str, old: str, new: str) -> str:
    """`source` with its one occurrence of `old` replaced: a product change that moves the
    text fails the probe instead of timing an unedited kernel."""
    if source.count(old) != 1:
        raise RuntimeError(f"probe edit expects exactly one {old!r} in the product kernel, found {source.count(old)}")
    return source.replace(old, new)


def _split_held(source: str) -> tuple[str, str, str]:
    """(what precedes normalize_held, its parameters and body, what follows from
    normalize_streamed on): edits of the held path alone, where both paths share lines."""
    head, held = source.split("fn normalize_held(", 1)
    held, tail = held.split("fn normalize_streamed(", 1)
    return head, held, tail


def _join_held(head: str, held: str, tail: str) -> str:
    return head + "fn normalize_held(" + held + "fn normalize_streamed(" + tail


def _first_x_load(held: str) -> str:
    return next(line for line in held.splitlines() if line.lstrip().startswith("let v_0 ")) + "\n"


def _move_affine_loads(config: KernelConfig, source: str, before: bool) -> str:
    """The held path with its weight/bias loads moved: just before the first x load
    (`before`) or just after the row merge, right before the stores."""
    head, held, tail = _split_held(source)
    loads = [line for line in held.splitlines() if line.lstrip().startswith(("let w_", "let b_"))]
    if len(loads) != 2 * config.hold:
        raise RuntimeError(f"expected {2 * config.hold} weight/bias loads in the held path, found {len(loads)}")
    for line in loads:
        held = _edit(held, line + "\n", "")
    moved = "".join(line + "\n" for line in loads)
    if before:
        anchor = _first_x_load(held)
        held = _edit(held, anchor, moved + anchor)
    else:
        anchor = "    let mean_rstd = finish_row(row, lane, stats);\n"
        held = _edit(held, anchor, anchor + moved)
    return _join_held(head, held, tail)


@dataclass(frozen=True)
class LateAffine(KernelConfig):
    """Held rows with weight and bias loaded after the row merge, right before the stores."""

    def source(self, g) -> str:
        return _move_affine_loads(self, super().source(g), before=False)


@dataclass(frozen=True)
class EarlyAffine(KernelConfig):
    """Held rows with weight and bias loaded before x (as the persistent kernel does once)."""

    def source(self, g) -> str:
        return _move_affine_loads(self, super().source(g), before=True)


@dataclass(frozen=True)
class UnclampedLoads(KernelConfig):
    """Threads past the last row load past the end of x (a storage read out of bounds gives
    0 or some value of the buffer, never a fault) instead of the last row: no x load address
    then waits for the launch's row count, a uniform read at the kernel's start."""

    def source(self, g) -> str:
        return _edit(super().source(g), "    return min(row, params.rows - 1u) * ROW_VECS;\n",
                     "    return row * ROW_VECS;\n")


# StagedAffine's workgroup copy of weight and bias, and its reads at the stores.
STAGED_DECLARATIONS = """
var<workgroup> staged_weight: array<V, ROW_VECS>;
var<workgroup> staged_bias: array<V, ROW_VECS>;

// The index is clamped: values past the row's end are never stored.
fn staged_weight_at(i: u32, in_row: bool) -> V {
    if (HAS_WEIGHT) {
        return staged_weight[min(i, ROW_VECS - 1u)];
    }
    return V(1.0);
}

fn staged_bias_at(i: u32, in_row: bool) -> V {
    if (HAS_BIAS) {
        return staged_bias[min(i, ROW_VECS - 1u)];
    }
    return V(0.0);
}

"""
STAGED_COPY = """    // Every thread of the workgroup, live or not, copies its share of weight and bias.
    for (var i = tid; i < ROW_VECS; i += WORKGROUP) {
        if (HAS_WEIGHT) { staged_weight[i] = read_weight(i); }
        if (HAS_BIAS) { staged_bias[i] = read_bias(i); }
    }
"""


@dataclass(frozen=True)
class StagedAffine(KernelConfig):
    """Held float32 rows with weight and bias copied into workgroup memory once per
    workgroup (before the x loads, each thread its share) and read from there at the stores
    instead of held in registers from the start: fewer registers per thread, and one L2 read
    of weight and bias per workgroup instead of one per row. The copy is waited for by a
    barrier after the thread's own statistics, before the row merge, which every thread of
    the workgroup reaches: threads past the last row return only after the merge."""

    @property
    def workgroup_bytes(self) -> int:
        """Workgroup memory: the staged weight and bias (a float32 row each) and the
        reduction's `partial` (a vec2<f32> per thread for each of its two sums)."""
        return 2 * 4 * self.width + 2 * 8 * self.workgroup

    def source(self, g) -> str:
        if self.hold < 1 or self.dtype != "float32":
            raise ValueError("staged affine is for held float32 rows (hold >= 1)")
        head, held, tail = _split_held(_move_affine_loads(self, super().source(g), before=False))
        for k in range(self.hold):
            held = _edit(held, f"let w_{k} = weight_at(", f"let w_{k} = staged_weight_at(")
            held = _edit(held, f"let b_{k} = bias_at(", f"let b_{k} = staged_bias_at(")
        anchor = _first_x_load(held)
        held = _edit(held, anchor, STAGED_COPY + anchor)
        anchor = "    let mean_row = row_mean("
        held = _edit(held, anchor, "    workgroupBarrier();  // the staged weight and bias are written\n" + anchor)
        if "return" in held.split("workgroupBarrier();", 1)[0]:
            raise RuntimeError("a thread of the held path may return before the staging barrier")
        return _join_held(head + STAGED_DECLARATIONS, held, tail)


def _held_statistics(source: str) -> str:
    """normalize_held's lines from its first statistic to its row statistics (`stats`),
    indented for persistent_rows.wgsl's loop."""
    lines = _split_held(source)[1].splitlines()
    first = lines.index("    var count = 0.0;")
    last = next(i for i, line in enumerate(lines) if line.startswith("    let stats = "))
    return "".join("    " + line + "\n" for line in lines[first:last + 1])


@dataclass(frozen=True)
class Persistent(KernelConfig):
    """Held rows on a persistent grid: about `sms` x `threads_per_sm` / workgroup workgroups,
    each taking rows_per_step rows at a time, grid-strided (persistent_rows.wgsl).

    `rows_per_workgroup` is overridden to the rows one workgroup takes over the whole launch,
    so that the product's `grid()` (and `time_kernel`, which calls it) launches this grid;
    the kernel's ROWS_PER_WORKGROUP stays the rows of one step (WORKGROUP / THREADS_PER_ROW)."""

    rows: int = 0
    sms: int = 132
    threads_per_sm: int = 512
    prefetch: bool = True

    @property
    def rows_per_step(self) -> int:
        return self.workgroup // self.threads_per_row

    @property
    def rows_per_workgroup(self) -> int:
        groups = max(1, self.sms * self.threads_per_sm // self.workgroup)
        return self.rows_per_step * max(1, math.ceil(self.rows / (groups * self.rows_per_step)))

    def prelude(self) -> str:
        return super().prelude() + f"const PREFETCH: bool = {str(self.prefetch).lower()};\n"

    def source(self, g) -> str:
        if self.hold < 1:
            raise ValueError("persistent rows are held rows (hold >= 1)")
        source = _edit(super().source(g), "fn normalize_rows(", "fn normalize_rows_one_launch_grid(")
        persistent = written_out(PERSISTENT_SOURCE.read_text(), {EACH_HELD_VALUE: self.hold})
        return source + _edit(persistent, "        HELD_STATISTICS\n", _held_statistics(source))


def _threads(config: KernelConfig, threads: int) -> KernelConfig:
    return replace(config, threads_per_row=threads, hold=math.ceil(config.row_vecs / threads),
                   workgroup=max(64, threads), unroll=1)


def variants(rows: int, width: int, subgroup_size: int, sms: int) -> dict[str, KernelConfig]:
    """Name -> config for one shape; variants that make no sense at this width are left out."""
    product = choose_config(width, True, True, subgroup_size)
    found = {"product": product}
    if product.hold < 1:  # streamed rows: none of the probe's shapes, and no variant here
        return found
    fields = {k: getattr(product, k) for k in product.__dataclass_fields__}
    found["late_affine"] = LateAffine(**fields)
    found["no_stats"] = replace(product, write_stats=False)
    found["early_affine"] = EarlyAffine(**fields)
    found["unclamped_loads"] = UnclampedLoads(**fields)
    tpr = product.threads_per_row
    for name, threads in (("threads_x2", 2 * tpr), ("threads_x4", 4 * tpr), ("threads_half", tpr // 2)):
        if 1 <= threads <= 1024 and math.ceil(product.row_vecs / threads) <= 16:
            found[name] = _threads(product, threads)
    if product.workgroup > max(32, tpr):
        found["workgroup_32"] = replace(product, workgroup=max(32, tpr))
    for t in (256, 512, 1024):
        found[f"persist_T{t}"] = Persistent(**fields, rows=rows, sms=sms, threads_per_sm=t)
    found["persist_serial_T512"] = Persistent(**fields, rows=rows, sms=sms, threads_per_sm=512, prefetch=False)
    if 2 * tpr <= 1024:
        wide = _threads(product, 2 * tpr)
        wide_fields = {k: getattr(wide, k) for k in wide.__dataclass_fields__}
        for t in (512, 1024):
            found[f"persist_x2_T{t}"] = Persistent(**wide_fields, rows=rows, sms=sms, threads_per_sm=t)
    # A W below the threads per row gives a workgroup already staged: it is not timed twice.
    limits = gpu().limits
    staged_workgroups = set()
    for w in (64, 128, 256, 512):
        staged = StagedAffine(**{**fields, "workgroup": max(w, tpr)})
        if (staged.workgroup not in staged_workgroups
                and staged.workgroup <= min(1024, limits["max-compute-invocations-per-workgroup"])
                and staged.workgroup_bytes <= limits["max-compute-workgroup-storage-size"]):
            found[f"staged_W{w}"] = staged
            staged_workgroups.add(staged.workgroup)
    return found


def check_inputs(rows: int, width: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows with their own offset and scale (so a wrong row merge shows), random weight and bias."""
    rng = np.random.default_rng(seed)
    offset = rng.uniform(-8, 8, (rows, 1))
    scale = rng.uniform(0.05, 20, (rows, 1))
    x = (rng.standard_normal((rows, width)) * scale + offset).astype(np.float32)
    return x, rng.standard_normal(width).astype(np.float32), rng.standard_normal(width).astype(np.float32)


class Checker:
    """Launches any config on one shape's inputs (outputs poisoned with NaN first, so an
    unwritten element fails) and holds out, mean and rstd against float64 with the kernel
    tests' rule: error at most 4x eager float32's (torch on the CPU) plus a floor of a few ulp
    (and, for out, one float32 ulp of the row's mean carried through rstd and weight)."""

    def __init__(self, rows: int, width: int):
        self.g = gpu()
        self.rows, self.width = rows, width
        x, w, b = check_inputs(rows, width)
        x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
        mean = x64.mean(axis=1)
        rstd = 1.0 / np.sqrt(((x64 - mean[:, None]) ** 2).mean(axis=1) + EPS)
        self.truth = ((x64 - mean[:, None]) * rstd[:, None] * w64 + b64, mean, rstd)
        eager = torch.ops.aten.native_layer_norm.default(
            torch.from_numpy(x), [width], torch.from_numpy(w), torch.from_numpy(b), EPS)
        self.eager_err = [self._err(e.reshape(t.shape).numpy(), t) for e, t in zip(eager, self.truth)]
        mean_ulp = np.spacing(np.abs(mean).astype(np.float32)).astype(np.float64) * rstd
        self.floors = [8 * np.finfo(np.float32).eps * max(float(np.abs(t).max()), 1.0) for t in self.truth]
        self.floors[0] += float(mean_ulp.max()) * max(1.0, float(np.abs(w).max()))

        impl = self.g.impl
        n = rows * width * 4
        self.bufs = [impl.buffer(max(16, s), u) for s, u in (
            (n, STORAGE), (width * 4, STORAGE), (width * 4, STORAGE),
            (n, STORAGE), (rows * 4, STORAGE), (rows * 4, STORAGE), (PARAMS_BYTES, UNIFORM))]
        for buf, data in zip(self.bufs, (x, w, b)):
            impl.write(buf, data)
        impl.write(self.bufs[6], pack_params(rows, EPS))
        self.staging = impl.buffer(n + 8 * rows, STAGING)
        self.product_out: np.ndarray | None = None

    @staticmethod
    def _err(got: np.ndarray, truth: np.ndarray) -> float:
        return float(np.abs(got.astype(np.float64) - truth).max())

    def run(self, config: KernelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        impl, (rows, width) = self.g.impl, (self.rows, self.width)
        pipeline = compile_pipeline(self.g, config)
        for buf, count in ((self.bufs[3], rows * width), (self.bufs[4], rows), (self.bufs[5], rows)):
            impl.write(buf, np.full(count, np.nan, dtype=np.float32))
        encoder = impl.encoder()
        encoder.compute(pipeline, [(impl.bind_group(pipeline, self.bufs), grid(rows, config))])
        n = rows * width * 4
        encoder.copy(self.bufs[3], 0, self.staging, 0, n)
        encoder.copy(self.bufs[4], 0, self.staging, n, rows * 4)
        encoder.copy(self.bufs[5], 0, self.staging, n + rows * 4, rows * 4)
        impl.submit(encoder)
        data = np.frombuffer(read_bytes(impl, self.staging, n + 8 * rows), dtype=np.float32)
        return data[: rows * width].reshape(rows, width), data[rows * width: rows * width + rows], data[rows * width + rows:]

    def check(self, config: KernelConfig, is_product: bool = False) -> dict:
        outputs = self.run(config)
        # A variant that does not write mean and rstd is held to its output alone.
        names = ("out", "mean", "rstd") if config.write_stats else ("out",)
        errors = [self._err(o, t) for o, t in zip(outputs, self.truth)][: len(names)]
        bounds = [4 * e + f for e, f in zip(self.eager_err, self.floors)][: len(names)]
        result = {
            "ok": all(np.isfinite(errors)) and all(e <= b for e, b in zip(errors, bounds)),
            "max_err": dict(zip(names, (float(f"{e:.3g}") for e in errors))),
            "bound": dict(zip(names, (float(f"{b:.3g}") for b in bounds))),
        }
        if is_product:
            self.product_out = outputs[0].copy()
        elif self.product_out is not None:
            result["bitwise_equal_to_product"] = bool(np.array_equal(outputs[0], self.product_out))
        return result

    def close(self) -> None:
        for buf in (*self.bufs, self.staging):
            buf.destroy()


def _guarded(what: str, fn, *args, **kwargs):
    """fn's value, or None with the error recorded: one failing column keeps the rest."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # recorded in the JSON, the probe goes on
        print(f"  {what} failed: {type(exc).__name__}: {exc}", flush=True)
        return None, f"{type(exc).__name__}: {str(exc)[:300]}"


def probe_shape(rows: int, width: int, sms: int, repeats: int, rounds: int, with_torch: bool,
                only: set[str] | None = None) -> dict:
    g = gpu()
    configs = {name: c for name, c in variants(rows, width, g.subgroup_size, sms).items()
               if only is None or name == "product" or name in only}
    t0 = time.perf_counter()
    checker = Checker(rows, width)
    checks = {name: checker.check(c, is_product=(name == "product")) for name, c in configs.items()}
    checker.close()
    check_s = time.perf_counter() - t0
    passed = {name: c for name, c in configs.items() if checks[name]["ok"]}
    for name in configs.keys() - passed.keys():
        print(f"  {name}: FAILED the float64 check {checks[name]}", flush=True)

    names = list(passed)
    times = {name: [] for name in names}
    copy_us: list[float] = []
    torch_cols: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        measured, _ = time_kernel(rows, width, [passed[n] for n in order], repeats=repeats)
        for name, (batched, isolated) in zip(order, measured):
            times[name].append((round(batched, 3), round(isolated, 3)))
        us = time_copy(rows, width, repeats=repeats)
        if us is not None:
            copy_us.append(round(us, 3))
        if r == 0 and with_torch and torch.cuda.is_available():
            for col, fn in (("torch_us", lambda: time_torch(rows, width, repeats=repeats)[0]),
                            ("compiled_us", lambda: time_torch_compiled(rows, width, repeats=repeats)),
                            ("torch_copy_us", lambda: time_torch_copy(rows, width, repeats=repeats))):
                value, error = _guarded(col, fn)
                torch_cols[col] = None if value is None else round(value, 3)
                if error:
                    errors[col] = error

    us = {name: round(statistics.median(t[0] for t in ts), 3) for name, ts in times.items()}
    copy = round(statistics.median(copy_us), 3) if copy_us else None
    result = {
        "rows": rows, "width": width, "mbytes": round(rows * width * 4 / 1e6, 2),
        "check_seconds": round(check_s, 1),
        "wgsl_copy_us": copy, "wgsl_copy_rounds": copy_us, **torch_cols,
        "us": us,  # batched, median over rounds
        "best": min(us, key=us.get) if us else None,
        "vs_product": {n: round(us["product"] / v, 3) for n, v in us.items()} if "product" in us else {},
        "rounds": {n: [t[0] for t in ts] for n, ts in times.items()},
        "isolated_us": {n: [t[1] for t in ts] for n, ts in times.items()},
        "checks": checks,
        "configs": {n: _describe(c, rows) for n, c in configs.items()},
    }
    if copy and "product" in us:
        result["kernel_eff"] = round(copy / us["product"], 3)
        result["best_eff"] = round(copy / us[result["best"]], 3)
    if torch_cols.get("compiled_us") and torch_cols.get("torch_copy_us"):
        result["triton_eff"] = round(torch_cols["torch_copy_us"] / torch_cols["compiled_us"], 3)
    if errors:
        result["errors"] = errors
    return result


def _describe(config: KernelConfig, rows: int) -> dict:
    """The config's fields, its grid and how many turns (rows per thread, in sequence) it takes."""
    x, y = grid(rows, config)
    per_step = config.workgroup // config.threads_per_row
    return {**asdict(config), "class": type(config).__name__, "grid": [x, y],
            "turns": math.ceil(rows / (x * y * per_step))}


def _write(path: Path, doc: dict) -> None:
    """Atomically (a timeout may end the probe at any moment)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def _line(r: dict) -> str:
    us = r["us"]
    parts = [f"{r['rows']:>6}x{r['width']:<5} copy {r['wgsl_copy_us']}"]
    for col in ("torch_us", "compiled_us", "torch_copy_us"):
        if r.get(col) is not None:
            parts.append(f"{col[:-3]} {r[col]}")
    parts.append(" ".join(f"{n}={v}" for n, v in us.items()))
    return " | ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=LOSING_SHAPES, help="ROWSxWIDTH list, 'model' or 'unaligned' "
                        "(default: the ten model shapes where the kernel loses most)")
    parser.add_argument("--repeats", type=int, default=200, help="timed launches per config and round (default 200)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds, order alternating (default 2)")
    parser.add_argument("--sms", type=int, default=0, help="SMs for the persistent grid (default: CUDA's count, else 132)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch columns")
    parser.add_argument("--variants", help="comma-separated variant names to time besides the product (default: all)")
    parser.add_argument("--json", help="output file (default: $OUT/waves_probe.json)")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    if args.repeats < 1 or args.rounds < 1 or args.sms < 0:
        parser.error("--repeats and --rounds must be at least 1, --sms at least 0")
    if args.json is None and "OUT" not in os.environ:
        parser.error("give --json FILE or set OUT")
    path = Path(args.json or Path(os.environ["OUT"]) / "waves_probe.json")
    cuda = torch.cuda.is_available()
    sms = args.sms or (torch.cuda.get_device_properties(0).multi_processor_count if cuda else 132)
    doc = {
        "machine": platform.node() + " " + platform.machine(),
        "device": device_info(),
        "torch": torch.__version__,
        "torch_device": torch.cuda.get_device_name() if cuda else "cpu",
        "sms": sms, "repeats": args.repeats, "rounds": args.rounds,
        "compiled": "torch.compile(F.layer_norm, dynamic=False), default mode, torch._dynamo.reset() per shape",
        "results": [],
    }
    print(f"adapter {doc['device']['adapter']}, subgroup {doc['device']['subgroup_size']}, sms {sms}, "
          f"torch {doc['torch_device']}", flush=True)
    start = time.perf_counter()
    failed = 0
    for rows, width in shapes:
        r = probe_shape(rows, width, sms, args.repeats, args.rounds, not args.no_torch,
                        set(args.variants.split(",")) if args.variants else None)
        failed += sum(not c["ok"] for c in r["checks"].values())
        doc["results"].append(r)
        doc["seconds"] = round(time.perf_counter() - start, 1)
        _write(path, doc)  # after every shape
        print(_line(r) + f"  [{doc['seconds']} s]", flush=True)
    print(f"wrote {path}; {failed} variant checks failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
