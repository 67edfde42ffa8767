"""Run an exported .pte: its model's example inputs, or your own, timed and checked against eager.

    python scripts/run_pte.py out/bart-base.pte
    python scripts/run_pte.py out/whisper-tiny.pte --repeats 5
    python scripts/run_pte.py model.pte --inputs my_inputs.pt      # torch.save of a tensor or tuple of tensors
    python scripts/run_pte.py out/whisper-tiny-xnnpack.pte --runtime executorch --etdump whisper.etdp

The model, variant, seed and checkpoint come from the <stem>.coverage.json that
export_model.py wrote beside the file (its sha256 must match the file). With a known
model the outputs are compared with eager (at the file's dtype) and float64: the run
passes when they are finite and their max error against float64 is at most twice eager's.
In ExecuTorch's runtime (--runtime executorch) the reference is the same model exported
with the same CPU backend and no WebGPU delegate, run there: the file passes when its
relative L2 error against float64 is at most 1.1x the reference's, its max abs error at
most 1.5x, and every LayerNorm delegate call's outputs are bit-identical to the Python
runtime's on the same inputs (the reference is exported in the run: seconds for whisper
tiny, minutes for Florence-2). --etdump FILE writes the timed runs' ETDump there: an event
per LayerNorm delegate call, for ExecuTorch's Inspector.
Exit status: 0 passed, 1 failed (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys


if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()

from pipeline import cli  # noqa: E402

RUNTIMES = ("python", "executorch")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pte", help="the .pte file")
    parser.add_argument("--inputs", metavar="FILE.pt", help="inputs saved with torch.save (default: the model's)")
    parser.add_argument("--audio", metavar="A.wav[,B.wav]", type=cli.audio_files, help="whisper: run the log-mel of these WAV files "
                        "(as many as the file's batch) instead of the inputs its export recorded")
    parser.add_argument("--runtime", choices=RUNTIMES, default="python",
                        help="python: pipeline.load (default); executorch: ExecuTorch's runtime with the native backend")
    parser.add_argument("--repeats", type=cli.positive_int, default=3, help="timed runs (default 3)")
    parser.add_argument("--etdump", metavar="FILE", help="with --runtime executorch: write the timed runs' ETDump "
                        "(an event per LayerNorm delegate call) to FILE")
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    if args.audio is not None and args.inputs is not None:
        parser.error("argument --audio: not with --inputs")
    if args.etdump is not None:
        if args.runtime != "executorch":
            parser.error("argument --etdump: needs --runtime executorch")
        from pathlib import Path

        from pipeline.ioutil import check_output_dir

        try:
            if Path(args.etdump).is_dir():
                raise ValueError(f"{args.etdump} is a directory")
            check_output_dir(Path(args.etdump).parent)
        except ValueError as exc:
            parser.error(f"argument --etdump: {exc}")
    cli.quiet_dependencies(args.verbose)

    from pipeline.evaluation.artifact import run_artifact

    try:
        result = run_artifact(args.pte, args.inputs, args.runtime, args.repeats,
                              progress=cli.say, etdump=args.etdump,
                              audio=args.audio)
    except KeyboardInterrupt:
        print("run_pte: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line for the user, status 1
        print(f"run_pte: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(f"{result['pte']} ({result['runtime']} runtime): loaded in {result['load_seconds']:.2f} s, "
          f"{result['seconds_per_run'] * 1e3:.1f} ms per run (median of {args.repeats})")
    for i, shape in enumerate(result["output_shapes"]):
        print(f"  output {i}: {shape}")
    if "executorch_verdict" in result:
        from pipeline.evaluation.executorch_verdict import verdict_lines

        verdict = result["executorch_verdict"]
        print(f"  rule: {verdict['rule']}")
        for line in verdict_lines(verdict):
            print(f"  {line}")
    elif "max_abs_vs_fp64" in result:
        dtype = result["dtype"]
        print(f"  max abs error: vs eager {dtype} {result['max_abs_vs_eager']:.3g}, vs float64 "
              f"{result['max_abs_vs_fp64']:.3g} (eager {dtype} vs float64 {result['eager_max_abs_vs_fp64']:.3g}, "
              f"limit {result['envelope']:g}x)")
    if "transcripts" in result:
        from pipeline.evaluation.transcripts import verdict_line

        print(f"  {verdict_line(result['transcripts'])}")
        for row in result["transcripts"]["utterances"]:
            mark = "" if row["tokens_identical"] else f"  DIFFERENT from token {row['first_difference']}"
            print(f"    {row['audio']}: {row['text_delegated']!r}{mark}")
            if not row["tokens_identical"]:
                print(f"    {' ' * len(row['audio'])}  eager: {row['text_eager']!r}")
    if "etdump" in result:
        print(f"  ETDump: {result['etdump']} (executorch.devtools.Inspector(etdump_path=...))")
    if not result["passed"]:
        why = "outputs are not finite" if not result["finite"] else "error against float64 exceeds the envelope"
        if "executorch_verdict" in result:
            why = result["executorch_verdict"]["why"] or why
        if "transcripts" in result and not result["transcripts"]["identical"]:
            why = "the transcripts differ: a token decoded from the file's encoder output is not eager's"
        print(f"run_pte: {why}", file=sys.stderr)
        return 1
    print("  passed")
    return 0


if __name__ == "__main__":
    _interrupts.run(main)
