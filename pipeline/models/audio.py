"""Speech in: WAV files read as 16 kHz mono waveforms, and the utterances the package ships.

Any WAV that scipy reads (PCM 8, 16, 24 or 32 bit, float 32 or 64, any rate, any channel
count) is read whole, its channels averaged to mono and resampled to 16 kHz with a
polyphase filter (`scipy.signal.resample_poly`). The log-mel of a waveform is the model's
business (`pipeline.models.whisper.log_mel`).

The shipped utterances (`utterances/*.wav`, their texts in `utterances/texts.tsv`) were
spoken by Debian's espeak-ng and are made again by `scripts/make_utterances.py`.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

SAMPLING_RATE = 16_000
# Whisper's encoder sees 30 s windows: a longer file would be cut, so it is refused.
MAX_SECONDS = 30.0
# A header can claim anything: files are read only up to this size (30 s of 8-channel float64 at 192 kHz).
MAX_BYTES = 400 * 2**20
UTTERANCES = "utterances"
TEXTS = "texts.tsv"


def read_wav(path: str | os.PathLike) -> np.ndarray:
    """The WAV file at `path` as float32 samples in [-1, 1], mono, at 16 kHz.

    ValueError naming the file when it is not a WAV file scipy can read, holds no samples,
    holds non-finite ones, or is longer than 30 s; FileNotFoundError when it is missing.
    """
    return _read(path)[0]


def read_wavs(paths: Sequence[str | os.PathLike]) -> tuple[list[np.ndarray], str]:
    """Each file as `read_wav` reads it, and one sha256 over the bytes decoded (in order: each
    file's length and bytes): each file is read once, so what is hashed is what is heard."""
    digest = hashlib.sha256()
    waves = []
    for path in paths:
        samples, data = _read(path)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
        waves.append(samples)
    return waves, digest.hexdigest()


def _read(path: str | os.PathLike) -> tuple[np.ndarray, bytes]:
    """read_wav's samples, and the file's bytes they were decoded from."""
    from scipy.io import wavfile
    from scipy.signal import resample_poly

    shown = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"audio {shown} not found")
    if not os.path.isfile(path):
        raise ValueError(f"audio {shown} is not a regular file")
    if os.path.getsize(path) > MAX_BYTES:
        raise ValueError(f"audio {shown}: {os.path.getsize(path)} bytes, more than {MAX_SECONDS:g} s of any WAV")
    raw = Path(path).read_bytes()
    try:
        rate, data = wavfile.read(io.BytesIO(raw))
    except Exception as exc:  # scipy raises ValueError, EOFError, struct.error, ... for what it cannot parse
        raise ValueError(f"audio {shown}: not a WAV file that can be read ({' '.join(str(exc).split())[:160]})") from None
    if rate <= 0:
        raise ValueError(f"audio {shown}: sampling rate {rate}")
    samples = _as_float(data, shown)
    if samples.ndim == 2:  # (frames, channels)
        samples = samples.mean(axis=1)
    if samples.size == 0:
        raise ValueError(f"audio {shown}: holds no samples")
    if not np.isfinite(samples).all():
        raise ValueError(f"audio {shown}: holds non-finite samples")
    seconds = samples.size / rate
    if seconds > MAX_SECONDS:
        raise ValueError(f"audio {shown}: {seconds:.1f} s long; Whisper's window is {MAX_SECONDS:g} s")
    if rate != SAMPLING_RATE:
        step = math.gcd(rate, SAMPLING_RATE)
        samples = resample_poly(samples, SAMPLING_RATE // step, rate // step)
    return samples.astype(np.float32), raw


def _as_float(data: np.ndarray, shown: str) -> np.ndarray:
    """PCM integers scaled to [-1, 1) (8-bit WAV is unsigned around 128); floats as they are."""
    if data.dtype == np.uint8:
        return (data.astype(np.float64) - 128.0) / 128.0
    if data.dtype.kind == "i":
        return data.astype(np.float64) / float(2 ** (8 * data.dtype.itemsize - 1))
    if data.dtype.kind == "f":
        return data.astype(np.float64)
    raise ValueError(f"audio {shown}: samples of type {data.dtype} are not audio")


def write_wav(path: str | os.PathLike, samples: np.ndarray) -> None:
    """`samples` (mono, 16 kHz, in [-1, 1]) as a 16-bit PCM WAV file, written atomically."""
    import io

    from scipy.io import wavfile

    from pipeline.ioutil import write_bytes_atomic

    pcm = np.clip(np.round(np.asarray(samples, dtype=np.float64) * 32767.0), -32768, 32767).astype(np.int16)
    buffer = io.BytesIO()
    wavfile.write(buffer, SAMPLING_RATE, pcm)
    write_bytes_atomic(path, buffer.getvalue())


def shipped_utterances() -> list[tuple[Path, str]]:
    """(WAV file, its text) of each utterance the package ships, in the order of texts.tsv."""
    folder = resources.files("pipeline.models").joinpath(UTTERANCES)
    return [(Path(str(folder.joinpath(f"{name}.wav"))), text) for name, text in read_texts(folder.joinpath(TEXTS))]


def read_texts(path) -> list[tuple[str, str]]:
    """(name, text) of each line `name<TAB>text` of a texts file (a path or a resource)."""
    if isinstance(path, (str, os.PathLike)):
        path = Path(path)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        name, tab, text = line.partition("\t")
        if not tab or not name or not text.strip():
            raise ValueError(f"{path}:{number}: expected NAME<TAB>TEXT")
        rows.append((name, text))
    return rows


def audio_paths(argument: str | Sequence[str | os.PathLike]) -> tuple[str, ...]:
    """The files of a `--audio A.wav[,B.wav]` argument (or a sequence of paths), as absolute
    paths; ValueError when it names none."""
    items = argument.split(",") if isinstance(argument, str) else [os.fspath(p) for p in argument]
    paths = tuple(os.path.abspath(p) for p in (item.strip() for item in items) if p)
    if not paths:
        raise ValueError("audio: names no file")
    return paths
