"""Benchmark the native_layer_norm kernel against torch's layer_norm (or, with --norm rms_norm,
its RMSNorm against torch's rms_norm).

Runs on a GPU host that has torch and wgpu but no ExecuTorch.
    python scripts/bench_layer_norm.py --shapes model --json benchmarks/results/NAME.json
    python scripts/bench_layer_norm.py --shapes model --ort --json benchmarks/results/NAME.json
    python scripts/bench_layer_norm.py --norm rms_norm --shapes llm --json benchmarks/results/NAME.json

--ort (the `bench` extra: onnxruntime-webgpu, onnx) adds ONNX Runtime's WebGPU
LayerNormalization in the same run: its kernel's GPU time from ORT's profiler and its
session.run host to host, beside our kernel and our delegate's call (--host-path), and the
errors of every implementation against float64 (--accuracy). A run on ORT's CPU provider is
refused.
"""

from __future__ import annotations

import argparse
import sys


if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()

from pipeline import cli  # noqa: E402
from pipeline.ioutil import check_output_file, json_bytes, write_json_atomic  # noqa: E402
from pipeline.benchmark import MAX_REPEATS, OUTPUTS, parse_shapes, run_benchmark  # noqa: E402
from pipeline.benchmark_ort import ORT_DTYPES, OrtColumn  # noqa: E402  (imports ORT only when a column is made)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="model",
                        help="comma list of 'model' (default), 'unaligned' (widths not a multiple of 4) and ROWSxWIDTH")
    parser.add_argument("--repeats", type=cli.positive_int, default=100, help="timed launches per shape (default 100)")
    parser.add_argument("--rounds", type=cli.positive_int, default=1,
                        help="time the kernel and the WGSL copy in this many interleaved rounds and report their "
                        "medians, and the median of the rounds' copy time over the kernel's (default 1)")
    parser.add_argument("--sweep", action="store_true", help="also time threads-per-row/workgroup variants")
    parser.add_argument("--json", metavar="FILE", help="write the results here (atomically)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="of x, weight, bias and out, for the kernel and torch (default float32); "
                        "bandwidth counts its bytes a value")
    parser.add_argument("--outputs", choices=OUTPUTS, default="rotating",
                        help="rotating (default): every launch, of the kernel, the copies and torch alike, writes "
                        "its own output, as it reads its own input; shared: they all write one output")
    parser.add_argument("--stats", action="store_true",
                        help="time the kernel storing mean and rstd too (default: the output alone, as a delegate "
                        "of the three models launches it, and as torch.compile's F.layer_norm computes it)")
    parser.add_argument("--host-path", action="store_true",
                        help="also time the call from host tensors to host tensors, as a delegate makes it (call_us), "
                        "the CUDA round trip on CUDA hosts (cuda_roundtrip_us) and torch on the CPU (torch_cpu_us)")
    parser.add_argument("--accuracy", action="store_true",
                        help="also each implementation's error against float64 LayerNorm on random rows and on rows "
                        "of 1e4 + 1e-2*randn and 300 + randn (ours, torch eager, torch.compile on CUDA)")
    parser.add_argument("--norm", choices=("layer_norm", "rms_norm"), default="layer_norm",
                        help="the norm timed: a LayerNorm with weight and bias (default), or an RMSNorm with a "
                        "weight beside F.rms_norm (--shapes llm: LLM widths)")
    parser.add_argument("--ort", action="store_true",
                        help="also ONNX Runtime's WebGPU LayerNormalization (pip install -e '.[bench]'): its kernel "
                        "from ORT's profiler and session.run host to host; implies --host-path and --accuracy")
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    if args.repeats > MAX_REPEATS:
        parser.error(f"argument --repeats: at most {MAX_REPEATS} (one query set holds the timestamps), got {args.repeats}")
    try:
        shapes = parse_shapes(args.shapes)
        cli.check_bench_shapes(shapes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.ort and args.dtype not in ORT_DTYPES:
        parser.error(f"argument --ort: ORT's WebGPU LayerNormalization takes {' or '.join(ORT_DTYPES)}, "
                     f"not {args.dtype}")
    if args.json:
        try:
            check_output_file(args.json)
        except ValueError as exc:
            parser.error(f"argument --json: {exc}")
    cli.quiet_dependencies(args.verbose)
    try:
        rms = args.norm == "rms_norm"
        columns = [OrtColumn(rms)] if args.ort else []
        # An RMSNorm's ORT column is timed alone: no host path or accuracy beside it.
        result = run_benchmark(shapes, repeats=args.repeats, sweep=args.sweep,
                               progress=cli.print_progress, dtype=args.dtype,
                               outputs=args.outputs, stats=args.stats,
                               host_path=args.host_path or (args.ort and not rms),
                               accuracy=args.accuracy or (args.ort and not rms), columns=columns,
                               rounds=args.rounds, rms=rms)
    except Exception as exc:  # one line for the user, status 1
        print(f"bench_layer_norm: {exc}", file=sys.stderr)
        return 1
    if args.json:
        try:
            write_json_atomic(args.json, result)
        except OSError as exc:  # a full disk: the results go to stdout rather than nowhere
            print(json_bytes(result).decode(), end="", flush=True)
            print(f"bench_layer_norm: cannot write {args.json} ({exc.strerror or exc}); "
                  "the results are above, on stdout", file=sys.stderr)
            return 1
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    _interrupts.run(main)
