"""Export a model with every LayerNorm delegated to the WebGPU kernel: writes the .pte and its coverage.

    python scripts/export_model.py bart
    python scripts/export_model.py whisper --variant tiny --output-dir out/
    python scripts/export_model.py bart --checkpoint path/to/bart-base --dynamic
    python scripts/export_model.py whisper --variant tiny --dtype float16
    python scripts/export_model.py --hf path/to/any-hf-model-dir [--task causal-lm] [--inputs inputs.pt]

Writes <output-dir>/<model>-<variant>.pte and <model>-<variant>.coverage.json
(<model>-<variant>-dynamic.* with --dynamic, <model>-<variant>-float16.* with --dtype float16;
<directory name>.* with --hf).
Exit status: 0 done, 1 failed (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys


if __name__ == "__main__":
    import _interrupts  # first: from here on a signal ends the script with one line

    _interrupts.while_starting()

from pipeline import cli  # noqa: E402
from pipeline.aot.export import export_model  # noqa: E402
from pipeline.ioutil import check_output_dir  # noqa: E402

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", choices=cli.MODEL_NAMES, help="which model to export (or --hf DIR)")
    # The variants are pipeline.models.variants(model)'s, which imports transformers: checked
    # below, an unknown one refused with that list.
    parser.add_argument("--variant", help="the model's variant (default: its default; an unknown one is refused "
                        "with the model's variants listed)")
    parser.add_argument("--checkpoint", metavar="DIR", help="local checkpoint: a Hugging Face directory (config.json + "
                        "safetensors) or, for whisper, a CTranslate2 one (model.bin, config.json, vocabulary)")
    parser.add_argument("--output-dir", metavar="DIR", default="out", help="where to write the files (default: out/)")
    parser.add_argument("--seed", type=cli.seed, default=0,
                        help="seed of the random weights and example inputs, 0 to 2**64 - 1 (default 0)")
    parser.add_argument("--dynamic", action="store_true", help="dynamic sequence lengths (bart)")
    parser.add_argument("--cpu-backend", choices=("portable", "xnnpack"), default="portable",
                        help="what runs the ops that are not LayerNorms: portable (ExecuTorch's CPU kernels; "
                        "default) or xnnpack (XNNPACK delegates: for ExecuTorch's runtime, see pipeline.native); "
                        "files of the latter are named <model>-<variant>-xnnpack.*")
    parser.add_argument("--audio", metavar="A.wav[,B.wav]", type=cli.audio_files, help="whisper: export with the log-mel of these WAV "
                        "files as the example inputs, one batch row each (default with --checkpoint: the utterances "
                        "the package ships); recorded in the coverage file")
    cli.add_hf(parser)
    cli.add_dtype(parser)
    cli.add_verbose(parser)
    args = parser.parse_args(argv)
    if args.model is None and args.hf is None:
        parser.error("give a model name or --hf DIR")
    if args.audio is not None and args.model != "whisper":
        parser.error("argument --audio: only whisper takes speech")
    try:
        check_output_dir(args.output_dir)
    except ValueError as exc:
        parser.error(f"argument --output-dir: {exc}")

    cli.quiet_dependencies(args.verbose)
    cli.check_hf(parser, args)
    from pipeline import models

    if args.variant is not None and args.variant not in models.variants(args.model):
        parser.error(f"argument --variant: invalid choice for {args.model}: {args.variant!r} "
                     f"(choose from {', '.join(models.variants(args.model))})")
    if args.dynamic and args.hf is None and models.family(args.model).make_dynamic_shapes is None:
        parser.error(f"argument --dynamic: {args.model} has no dynamic dimension")

    try:
        summary = export_model(
            args.model, args.variant, args.checkpoint, args.output_dir, args.seed, args.dynamic,
            progress=cli.say, cpu_backend=args.cpu_backend,
            dtype=args.dtype, audio=args.audio, hf=args.hf, task=args.task, inputs=args.inputs,
        )
    except KeyboardInterrupt:
        print("export_model: interrupted; no file was left half-written", file=sys.stderr)
        return 130
    except Exception as exc:  # one line for the user, status 1
        print(f"export_model: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    kinds = ", ".join(f"{kind} {c['delegated']}/{c['total']}" for kind, c in summary["norm_kinds"].items())
    print(f"{summary['model']}-{summary['variant']}: {summary['delegated']}/{summary['layer_norm_ops']} "
          f"norms delegated{f' ({kinds})' if kinds else ''}, {summary['pte_bytes'] / 1e6:.1f} MB, "
          f"{summary['export_seconds']:.1f} s")
    print(f"  {summary['pte']}\n  {summary['coverage_json']}")
    return 0


if __name__ == "__main__":
    _interrupts.run(main)

