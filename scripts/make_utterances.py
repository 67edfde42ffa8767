"""Make the utterances the package ships again: each line NAME<TAB>TEXT of
pipeline/models/utterances/texts.tsv spoken by Debian's espeak-ng (`apt-get install espeak-ng`),
resampled to 16 kHz mono and written as NAME.wav (16-bit PCM) beside it.

    python scripts/make_utterances.py [--voice en-us] [--speed 150]

espeak-ng is deterministic: the same version, voice and speed give the same files.
Exit status: 0 done, 1 failed (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voice", default="en-us", help="espeak-ng voice (default en-us)")
    parser.add_argument("--speed", type=int, default=150, help="words per minute (default 150)")
    args = parser.parse_args(argv)
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        print("make_utterances: espeak-ng not found (apt-get install espeak-ng)", file=sys.stderr)
        return 1
    from pipeline import cli

    cli.quiet_dependencies(False)
    from pipeline.models.audio import TEXTS, UTTERANCES, read_texts, read_wav, write_wav

    folder = Path(str(resources.files("pipeline.models").joinpath(UTTERANCES)))
    try:
        texts = read_texts(folder / TEXTS)
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in texts:
                spoken = Path(tmp) / f"{name}.wav"
                subprocess.run([espeak, "-v", args.voice, "-s", str(args.speed), "-w", str(spoken), text],
                               check=True, capture_output=True, timeout=60)
                samples = read_wav(spoken)  # espeak-ng speaks at 22,050 Hz: resampled here
                write_wav(folder / f"{name}.wav", samples)
                print(f"{folder / name}.wav: {samples.size / 16000:.2f} s  {text}")
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        print(f"make_utterances: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
