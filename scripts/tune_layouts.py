"""Tune the native_layer_norm kernel's layouts on this device and write the table that
PIPELINE_LAYOUTS points the runtimes at (the Python runtime and ExecuTorch's C++ backend).

    python scripts/tune_layouts.py --shapes model --dtype float16 --out layouts/h200-wgpu.txt
    python scripts/tune_layouts.py --norm rms_norm --shapes llm --out layouts/h200-wgpu.txt --append
    python scripts/tune_layouts.py --pte out/bart-base.pte --out layouts/h200-wgpu.txt --append
    PIPELINE_LAYOUTS=layouts/h200-wgpu.txt python scripts/run_pte.py ...
    python scripts/tune_layouts.py --twin layouts/h200-wgpu.txt   # after editing it by hand

Each launch (a --norm of ROWSxWIDTH at --dtype, weight and bias in that dtype (an RMSNorm's
weight alone), the output alone stored as the models' delegates do; --stats stores a
LayerNorm's mean and rstd too) is timed in its rule's layout
and at half and twice the threads per row in workgroups of 64, 128 and 256; a layout enters
the table where it beats the rule by --min-gain. Tune through the implementation you will
run (PIPELINE_WEBGPU: a table names its adapter and implementation, and a runtime refuses
one tuned elsewhere). --append adds to (and updates) an existing table of this device. The
table's binary twin, which the C++ backend reads (pipeline.wgsl.layouts), is written beside
it (FILE.bin); --twin writes it again for a table edited by hand. A
table in pipeline/wgsl/tuned/, named as pipeline.wgsl.layouts.shipped_name names it, ships with
the package: its device takes it without PIPELINE_LAYOUTS (the C++ from its next build).

--pte tunes the launches a program makes instead: it runs the file in the Python runtime on
its model's example inputs (the .coverage.json beside it names the model, which is built for
them) or on --inputs, and takes each delegate call's norm, dtypes, affine parts, stats, width
and rows.
"""

from __future__ import annotations

import argparse
import os
import sys


if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()

from pipeline import cli  # noqa: E402
from pipeline.ioutil import check_output_file  # noqa: E402
from pipeline.benchmark import MAX_REPEATS, parse_shapes  # noqa: E402
from pipeline.runtime.device import device_info  # noqa: E402
from pipeline.tune import MIN_GAIN, program_launches, tune  # noqa: E402
from pipeline.wgsl import layouts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes",
                        help="comma list of 'model' (the default without --pte: the three models' LayerNorm shapes), "
                        "'unaligned' and ROWSxWIDTH")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="of x, weight, bias and out (default float32); give several runs --append for several")
    parser.add_argument("--norm", choices=layouts.NORMS, help="the norm the launches run (default layer_norm)")
    parser.add_argument("--stats", action="store_true", help="launches that store mean and rstd too (layer_norm)")
    parser.add_argument("--pte", metavar="FILE", help="tune the launches this program makes instead of --shapes")
    parser.add_argument("--inputs", metavar="FILE.pt",
                        help="with --pte: run it on these (torch.save of a tensor or tuple) instead of its model's")
    parser.add_argument("--out", metavar="FILE", help="the table to write (atomically, with its binary twin FILE.bin)")
    parser.add_argument("--twin", metavar="FILE",
                        help="only write the binary twin of this table (one edited by hand) and stop")
    parser.add_argument("--append", action="store_true",
                        help="keep the entries of an existing --out (tuned on this device) and add these")
    parser.add_argument("--rounds", type=cli.positive_int, default=3, help="interleaved rounds per shape (default 3)")
    parser.add_argument("--repeats", type=cli.positive_int, default=100, help="timed launches a round (default 100)")
    parser.add_argument("--min-gain", type=float, default=MIN_GAIN,
                        help=f"the rule's time over a layout's for it to enter the table (default {MIN_GAIN})")
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    if args.twin:
        return _write_twin(parser, args)
    if not args.out:
        parser.error("the following arguments are required: --out (or --twin)")
    if args.repeats > MAX_REPEATS:
        parser.error(f"argument --repeats: at most {MAX_REPEATS}, got {args.repeats}")
    if not args.min_gain >= 1:
        parser.error(f"argument --min-gain: at least 1, got {args.min_gain}")
    if args.pte and (args.shapes or args.dtype or args.stats or args.norm):
        parser.error("argument --pte: not with --shapes, --dtype, --norm or --stats (the program's launches carry "
                     "their own)")
    if args.stats and args.norm == "rms_norm":
        parser.error("argument --stats: an rms_norm stores no mean and rstd")
    if args.inputs and not args.pte:
        parser.error("argument --inputs: only with --pte")
    try:
        shapes = [] if args.pte else parse_shapes(args.shapes or "model")
        cli.check_bench_shapes(shapes)
        check_output_file(args.out)
        kept = layouts.read(args.out) if args.append and os.path.exists(args.out) else None
    except ValueError as exc:
        parser.error(str(exc))
    cli.quiet_dependencies(args.verbose)
    dtype, rms = args.dtype or "float32", args.norm == "rms_norm"
    try:
        launches = (_program_launches(args.pte, args.inputs) if args.pte else
                    [layouts.Launch(dtype, dtype, True, not rms, args.stats, width, rows, args.norm or "layer_norm")
                     for rows, width in shapes])
        if kept is not None:  # before any timing: a table of another device is not added to
            info = device_info()
            kept.check_device(info["adapter"], info["implementation"])
        table = tune(launches, rounds=args.rounds, repeats=args.repeats, min_gain=args.min_gain,
                     progress=cli.print_progress)
        if kept is not None:
            for launch in launches:
                kept.entries.pop(launch, None)
            table.entries = {**kept.entries, **table.entries}
        table.write(args.out)
    except Exception as exc:  # one line for the user, status 1
        print(f"tune_layouts: {exc}", file=sys.stderr)
        return 1
    cli.print_progress(f"wrote {args.out}: {len(table.entries)} layouts for {table.adapter} ({table.implementation})")
    return 0


def _write_twin(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if any(getattr(args, name) for name in ("shapes", "dtype", "norm", "stats", "pte", "inputs", "out", "append")):
        parser.error("argument --twin: alone (it writes the twin of a table and tunes nothing)")
    try:
        table = layouts.write_twin(args.twin)
    except (layouts.LayoutsError, OSError) as exc:
        print(f"tune_layouts: {exc}", file=sys.stderr)
        return 1
    cli.print_progress(f"wrote {layouts.twin_path(args.twin)}: {len(table.entries)} layouts for {table.adapter} "
                       f"({table.implementation})")
    return 0


def _program_launches(pte: str, inputs_path: str | None) -> list[layouts.Launch]:
    """The launches the program at `pte` makes on `inputs_path`'s inputs, or its model's."""
    from pipeline.evaluation.artifact import build_for_artifact, program_loader, read_artifact_file, read_inputs, read_pte

    if inputs_path is None:
        summary, data = read_artifact_file(pte)
        cli.print_progress(f"building {summary['model']}-{summary['variant']} for its example inputs")
        inputs = build_for_artifact(summary).example_inputs
    else:
        data, inputs = read_pte(pte), read_inputs(inputs_path)
    found = program_launches(program_loader("python")(data, str(pte)), inputs)
    cli.print_progress(f"{pte}: {len(found)} distinct launches")
    return found


if __name__ == "__main__":
    _interrupts.run(main)
