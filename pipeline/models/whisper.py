"""`whisper`: the Whisper encoder — log-mel features of a 30 s window in, hidden states out.

A Hugging Face checkpoint of the whole model (`WhisperForConditionalGeneration`: weights under
`model.decoder.` beside the encoder's; or `WhisperModel`'s, under `decoder.`, the output
projection tied to the token embedding) is read with its tokenizer vocabulary where the directory
holds one (`pipeline.models.vocabulary`), and `whole_model` gives the whole model for the
transcripts: the zoo's module stays the encoder.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from pipeline.models import audio
from pipeline.models.checkpoint import CONFIG, NESTED, Checkpoint, plan_weights, read_weights
from pipeline.models.sizes import check_sizes
from pipeline.models.spec import ConfigInt, ModelFamily, Vocabulary
from pipeline.models.vocabulary import read_vocabulary

# The names `WhisperForConditionalGeneration` saves its decoder's weights under (`WhisperModel`
# the same without `model.`): a checkpoint holding any is the whole model.
DECODER = "model.decoder."
ENCODER = "model.encoder."
# Whisper's last 1,501 tokens: the timestamps <|0.00|> to <|30.00|>, 20 ms apart.
TIMESTAMPS = tuple(f"<|{i * 0.02:.2f}|>" for i in range(1501))
# The encoder's positions: 3000 log-mel frames (30 s), halved by its second convolution; the
# inputs are always that window, so a checkpoint of other positions is refused before building.
ENCODER_POSITIONS = 1500
# Published Whisper models have 6 (tiny) to 20 (large) heads; the attention's scores take
# heads x 1500 x 1500 values a layer, so a head count is bounded for more than memory's sake.
MAX_HEADS = 32

CLIP_SECONDS = 8.0


class WhisperEncoderModel(torch.nn.Module):
    """input_features (B, num_mel_bins, 3000) -> last_hidden_state (B, 1500, d_model)."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.encoder = WhisperEncoder(config)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features).last_hidden_state


def synthetic_speechlike(sampling_rate: int, seed: int) -> np.ndarray:
    """A rising chirp (100 Hz to 4 kHz) under a syllable-rate envelope, plus seeded noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(CLIP_SECONDS * sampling_rate)) / sampling_rate
    f0, f1 = 100.0, 4000.0
    phase = 2 * math.pi * (f0 * t + (f1 - f0) * t**2 / (2 * CLIP_SECONDS))
    # Peak 0.5, opening and closing four times a second like syllables.
    envelope = 0.25 * (1 + np.sin(2 * math.pi * 4 * t))
    wave = envelope * np.sin(phase) + 0.01 * rng.standard_normal(t.shape)
    return wave.astype(np.float32)


def feature_extractor(config: WhisperConfig, preprocessor: dict[str, Any]) -> WhisperFeatureExtractor:
    # The mel count comes from the model: large-v3 takes 128 bins, the others 80.
    return WhisperFeatureExtractor(
        feature_size=config.num_mel_bins,
        sampling_rate=preprocessor["sampling_rate"],
        hop_length=preprocessor["hop_length"],
        chunk_length=preprocessor["chunk_length"],
        n_fft=preprocessor["n_fft"],
        padding_value=preprocessor["padding_value"],
    )


def log_mel(waves: list[np.ndarray], config: WhisperConfig, preprocessor: dict[str, Any]) -> torch.Tensor:
    """(B, num_mel_bins, 3000) float32: the log-mel of each 16 kHz waveform, padded to the
    30 s window the encoder's positions are sized for."""
    extractor = feature_extractor(config, preprocessor)
    features = extractor(waves, sampling_rate=preprocessor["sampling_rate"], return_tensors="pt").input_features
    return features.to(torch.float32)


def make_inputs(config: WhisperConfig, preprocessor: dict[str, Any], seed: int) -> tuple[torch.Tensor]:
    return (log_mel([synthetic_speechlike(preprocessor["sampling_rate"], seed)], config, preprocessor),)


def speech_inputs(config: WhisperConfig, preprocessor: dict[str, Any],
                  files: Sequence[str]) -> tuple[tuple[torch.Tensor], str]:
    """The log-mel of each WAV file (any rate and channel count), one batch row per file, and
    the sha256 of the bytes they came from (`audio.read_wavs`)."""
    if preprocessor["sampling_rate"] != audio.SAMPLING_RATE:
        raise ValueError(f"the model's features are at {preprocessor['sampling_rate']} Hz, not {audio.SAMPLING_RATE}")
    waves, sha256 = audio.read_wavs(files)
    features = log_mel(waves, config, preprocessor)
    for path, wave, row in zip(files, waves, features):
        # Samples far beyond [-1, 1] overflow the spectrogram's float32 powers: NaN throughout.
        if not bool(torch.isfinite(row).all()):
            raise ValueError(f"audio {path}: its log-mel is not finite (samples up to "
                             f"{float(np.abs(wave).max()):.3g}; a WAV's are within [-1, 1])")
    return (features,), sha256


def whole_vocabulary(root: Path, shown: str, config: WhisperConfig, names: Collection[str]) -> Vocabulary | None:
    """The tokenizer vocabulary of a checkpoint that holds the whole Whisper (`ModelFamily.read_vocabulary`);
    None for an encoder-only checkpoint or one without vocabulary files."""
    if not any(name.startswith((DECODER, DECODER.removeprefix(NESTED))) for name in names):
        return None
    return read_vocabulary(root, shown, config.vocab_size, TIMESTAMPS)


FAMILY = ModelFamily(
    name="whisper",
    # The English-only models (.en) share their encoder with the multilingual ones; their
    # vocabulary (51864 tokens, not 51865) tells them apart.
    variants=("tiny", "tiny.en", "base", "base.en", "small", "small.en", "medium", "medium.en", "large-v3"),
    default_variant="base",
    model_type="whisper",
    config_class=WhisperConfig,
    make_module=WhisperEncoderModel,
    make_inputs=make_inputs,
    signature=lambda c: (
        c.d_model, c.encoder_layers, c.encoder_attention_heads, c.encoder_ffn_dim,
        c.num_mel_bins, c.max_source_positions, c.vocab_size,
    ),
    hidden_size=lambda c: c.d_model,
    sizes=(
        ConfigInt("d_model"), ConfigInt("encoder_layers", repeats=True),
        ConfigInt("encoder_attention_heads", below=MAX_HEADS + 1), ConfigInt("encoder_ffn_dim"),
        ConfigInt("num_mel_bins"),
        ConfigInt("max_source_positions", minimum=ENCODER_POSITIONS, below=ENCODER_POSITIONS + 1),
    ),
    divides=(("encoder_attention_heads", "d_model"),),
    read_vocabulary=whole_vocabulary,
)


def whole_family(config: WhisperConfig) -> ModelFamily:
    """The whole model as a family entry for the checkpoint reader's checks: its decoder's sizes
    too, and the output projection, when tied to the token embedding, read from the embedding
    (which is all that `save_pretrained` writes of the two)."""
    tied = {"proj_out.weight": (f"{DECODER}embed_tokens.weight",)} if config.tie_word_embeddings else {}
    return replace(
        FAMILY,
        make_module=WhisperForConditionalGeneration,
        sizes=(*FAMILY.sizes, ConfigInt("decoder_layers", repeats=True),
               ConfigInt("decoder_attention_heads", below=MAX_HEADS + 1), ConfigInt("decoder_ffn_dim"),
               ConfigInt("max_target_positions"), ConfigInt("vocab_size")),
        divides=(*FAMILY.divides, ("decoder_attention_heads", "d_model")),
        weight_aliases=tied,
    )


def plan_whole(checkpoint: Checkpoint) -> dict[str, str]:
    """`plan_weights` of the whole model (decoder and output projection with the encoder): a
    checkpoint whose config sizes do not fit its tensors, or with a missing, misshapen,
    non-float or unused weight, is refused by name before anything is built."""
    family = whole_family(checkpoint.config)
    check_sizes(checkpoint.config, family, f"{checkpoint.shown}: {CONFIG}", len(checkpoint.tensors),
                sum(t.numel for t in checkpoint.tensors.values()))
    return plan_weights(checkpoint, family)


def whole_model(checkpoint: Checkpoint, encoder: WhisperEncoder, dtype: torch.dtype) -> WhisperForConditionalGeneration:
    """The whole Whisper of a Hugging Face checkpoint that holds it, at `dtype`, eval mode:
    `encoder` is the zoo module's (read from the same files, not read again), the decoder and
    the output projection are read from the files, each weight checked first (`plan_whole`)."""
    plan = plan_whole(checkpoint)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(checkpoint.config)
    dtypes = {key: dtype if t.is_floating_point() else t.dtype for key, t in model.state_dict().items()}
    state = read_weights(checkpoint, {key: name for key, name in plan.items() if not key.startswith(ENCODER)}, dtypes)
    state.update({f"{ENCODER}{key}": t.to(dtypes[f"{ENCODER}{key}"]) for key, t in encoder.state_dict().items()})
    # assign: the meta tensors are replaced by these; the tie is made again after.
    model.load_state_dict(state, strict=True, assign=True)
    if checkpoint.config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()
