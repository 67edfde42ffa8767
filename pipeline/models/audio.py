"""Speech in: WAV files read as 16 kHz mono waveforms, and the utterances the package ships.

A WAV of PCM (8, 16, 24 or 32 bit) or float (32 or 64 bit) samples is read: its header
first (the rate from 1 to 384 kHz, at most 32 channels, at most 30 s and MAX_SAMPLES samples),
then the samples of the data chunk it checked, decoded here (never another chunk's), as
float32, their channels averaged to mono and resampled to 16 kHz exactly with a polyphase
filter (`scipy.signal.resample_poly`), whose length bounds the rates. The log-mel of a
waveform is the model's business (`pipeline.models.whisper.log_mel`).

The shipped utterances (`utterances/*.wav`, their texts in `utterances/texts.tsv`) were
spoken by Debian's espeak-ng and are made again by `scripts/make_utterances.py`.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from pipeline.ioutil import FileTooLarge, NotRegularFile, read_regular

SAMPLING_RATE = 16_000
# Whisper's encoder sees 30 s windows: a longer file would be cut, so it is refused.
MAX_SECONDS = 30.0
# What a header may claim, checked before a sample is decoded: rates resampled exactly by a
# polyphase filter of at most 20 x 384,000 taps (a rate of no common factor with 16 kHz needs
# one as long as 20 x the rate), channels, and samples in all (30 s of 8 channels at 48 kHz;
# 46 MB as float32).
MIN_RATE, MAX_RATE = 1_000, 384_000
MAX_CHANNELS = 32
MAX_SAMPLES = 30 * 48_000 * 8
# The file is read whole (it is hashed as read): its samples at 8 bytes each, and 1 MiB of
# other chunks.
MAX_BYTES = MAX_SAMPLES * 8 + (1 << 20)
# Files of one call: each is decoded, resampled and run through the encoder as one batch.
MAX_FILES = 16
UTTERANCES = "utterances"
TEXTS = "texts.tsv"
# WAVE format tags: PCM, IEEE float, and the extensible header that names one of them.
PCM, FLOAT, EXTENSIBLE = 1, 3, 0xFFFE
READ_BITS = {PCM: (8, 16, 24, 32), FLOAT: (32, 64)}
# The numpy dtype of each sample a WAV stores (little-endian), 24-bit PCM aside.
SAMPLE_DTYPES = {(PCM, 8): "u1", (PCM, 16): "<i2", (PCM, 32): "<i4", (FLOAT, 32): "<f4", (FLOAT, 64): "<f8"}


def read_wav(path: str | os.PathLike) -> np.ndarray:
    """The WAV file at `path` as float32 samples in [-1, 1], mono, at 16 kHz.

    ValueError naming the file when it is not a regular file, not a PCM or float WAV file,
    holds no samples, holds samples that are not finite as float32, or claims a rate, channel
    count or length out of bounds (MIN_RATE to MAX_RATE, MAX_CHANNELS, 30 s): all checked from
    its header before a sample is decoded. FileNotFoundError when it is missing.
    """
    return _read(path)[0]


def read_wavs(paths: Sequence[str | os.PathLike]) -> tuple[list[np.ndarray], str]:
    """Each file as `read_wav` reads it, and one sha256 over the bytes decoded (in order: each
    file's length and bytes): each file is read once, so what is hashed is what is heard. At
    most MAX_FILES files (ValueError before any is read)."""
    if len(paths) > MAX_FILES:
        raise ValueError(f"audio: {len(paths)} files; at most {MAX_FILES} are read in one call")
    digest = hashlib.sha256()
    waves = []
    for path in paths:
        samples, data = _read(path)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
        waves.append(samples)
    return waves, digest.hexdigest()


@dataclass(frozen=True)
class WavHeader:
    """What a WAV file's `fmt ` and `data` chunks say, before its samples are decoded."""

    tag: int  # PCM or FLOAT (an extensible header's sub-format)
    channels: int
    rate: int
    bits: int
    frames: int  # the frames the data chunk holds
    start: int  # where its samples start in the file


def _read(path: str | os.PathLike) -> tuple[np.ndarray, bytes]:
    """read_wav's samples, and the file's bytes they were decoded from."""
    from scipy.signal import resample_poly

    shown = os.fspath(path)
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        raise FileNotFoundError(f"audio {shown} not found") from None
    except NotRegularFile as exc:
        raise ValueError(f"audio {shown} is not a regular file ({exc.kind})") from None
    except FileTooLarge:
        raise ValueError(f"audio {shown}: larger than {MAX_BYTES} bytes, more than {MAX_SECONDS:g} s of "
                         "any WAV this reads") from None
    except OSError as exc:
        raise ValueError(f"audio {shown} cannot be read: {exc.strerror or exc}") from None
    header = wav_header(raw, shown)
    samples = _samples(raw, header)
    if samples.size == 0:
        raise ValueError(f"audio {shown}: holds no samples")
    # A sample that is not finite (or a mix or filter past float32's range) is refused below,
    # in our words: numpy's warnings on the way are not the user's.
    with np.errstate(over="ignore", invalid="ignore"):
        if header.channels > 1:
            samples = samples.reshape(header.frames, header.channels).mean(axis=1, dtype=np.float64).astype(np.float32)
        if header.rate != SAMPLING_RATE:
            step = math.gcd(header.rate, SAMPLING_RATE)
            samples = resample_poly(samples, SAMPLING_RATE // step, header.rate // step).astype(np.float32)
    if not np.isfinite(samples).all():
        raise ValueError(f"audio {shown}: holds samples that are not finite as float32")
    return samples, raw


def wav_header(raw: bytes, shown: str) -> WavHeader:
    """The header of the WAV file whose bytes are `raw`; ValueError naming `shown` for one this
    does not read, or whose rate, channels or length are out of bounds."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise ValueError(f"audio {shown}: not a WAV file that can be read (no RIFF WAVE header)")
    fmt, data, at = None, None, 12
    while at + 8 <= len(raw) and (fmt is None or data is None):
        chunk, size = raw[at:at + 4], struct.unpack_from("<I", raw, at + 4)[0]
        if chunk == b"fmt ":
            fmt = raw[at + 8:at + 8 + size]
        elif chunk == b"data":
            data = (at + 8, size)
        at += 8 + size + (size & 1)  # chunks are padded to even sizes
    if fmt is None or len(fmt) < 16 or data is None:
        raise ValueError(f"audio {shown}: not a WAV file that can be read (no complete fmt and data chunks)")
    tag, channels, rate, _, block, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack_from("<H", fmt, 24)[0]  # the sub-format GUID's first two bytes
    if bits not in READ_BITS.get(tag, ()):
        kind = {PCM: "PCM", FLOAT: "float"}.get(tag, f"format {tag}")
        raise ValueError(f"audio {shown}: {kind} of {bits} bits per sample is not read (PCM of 8, 16, 24 or "
                         "32 bits; float of 32 or 64)")
    if not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"audio {shown}: {channels} channels; 1 to {MAX_CHANNELS} are read")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ValueError(f"audio {shown}: sampling rate {rate} Hz; {MIN_RATE} to {MAX_RATE} Hz are read "
                         f"(resampled exactly to {SAMPLING_RATE} Hz)")
    if block != channels * bits // 8:
        raise ValueError(f"audio {shown}: not a WAV file that can be read (frames of {block} bytes for "
                         f"{channels} channels of {bits} bits)")
    start, size = data
    if start + size > len(raw):
        raise ValueError(f"audio {shown}: truncated: its data chunk declares {size} bytes, {len(raw) - start} "
                         "are there")
    if size % block:
        raise ValueError(f"audio {shown}: not a WAV file that can be read (a data chunk of {size} bytes is not "
                         f"whole frames of {block})")
    frames = size // block
    if frames > MAX_SECONDS * rate:
        raise ValueError(f"audio {shown}: {frames} frames at {rate} Hz are {frames / rate!r} s; Whisper's "
                         f"window is {MAX_SECONDS:g} s")
    if frames * channels > MAX_SAMPLES:
        raise ValueError(f"audio {shown}: {frames * channels} samples ({channels} channels); at most "
                         f"{MAX_SAMPLES} are read")
    return WavHeader(tag, channels, rate, bits, frames, start)


def _samples(raw: bytes, header: WavHeader) -> np.ndarray:
    """The samples of the data chunk `header` describes, interleaved, as float32: PCM integers
    scaled to [-1, 1) (8-bit WAV is unsigned around 128), floats as they are."""
    data = np.frombuffer(raw, np.uint8, header.frames * header.channels * header.bits // 8, header.start)
    if header.bits == 24:  # three bytes a sample, placed in the top of an int32 and scaled as one
        wide = np.zeros((data.size // 3, 4), np.uint8)
        wide[:, 1:] = data.reshape(-1, 3)
        values = wide.view("<i4").reshape(-1)
    else:
        values = data.view(SAMPLE_DTYPES[header.tag, header.bits])
    if header.tag == FLOAT:
        with np.errstate(over="ignore"):  # a float64 beyond float32's range is inf, refused after
            return values.astype(np.float32)
    if header.bits == 8:
        return (values.astype(np.float32) - 128.0) / 128.0
    return (values / float(2 ** (8 * values.dtype.itemsize - 1))).astype(np.float32)


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
    paths; ValueError when it names none, or more than MAX_FILES. An argument that names an
    existing file as a whole is that file, commas and all."""
    if isinstance(argument, str):
        items = [argument] if os.path.isfile(argument) else argument.split(",")
    else:
        items = [os.fspath(p) for p in argument]
    paths = tuple(os.path.abspath(p) for p in (item.strip() for item in items) if p)
    if not paths:
        raise ValueError("audio: names no file")
    if len(paths) > MAX_FILES:
        raise ValueError(f"audio: {len(paths)} files; at most {MAX_FILES} are read in one call")
    return paths
