"""Shrunken configs of the three zoo families and the seeded models built from them, for fast tests."""

from __future__ import annotations

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    Florence2Config,
    Florence2ForConditionalGeneration,
    PreTrainedModel,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

_BART = dict(
    d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128, max_position_embeddings=64,
)


def tiny_config(name: str):
    """A config of family `name` small enough to build, export and save in well under a second."""
    if name == "bart":
        return BartConfig(**_BART)
    if name == "whisper":
        return WhisperConfig(
            d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80, max_source_positions=1500,
            vocab_size=51865,
        )
    if name == "florence2":
        return Florence2Config(
            vision_config=dict(
                embed_dim=[8, 16, 16, 32], num_heads=[1, 2, 2, 4], num_groups=[1, 2, 2, 4],
                depths=[1, 1, 1, 1], projection_dim=32, window_size=12,
            ),
            text_config=dict(model_type="bart", **_BART),
        )
    raise ValueError(name)


def tiny_full_model(name: str, seed: int = 1) -> PreTrainedModel:
    """The whole published model class (decoder, language model and all), as checkpoints hold it."""
    classes = {
        "bart": BartForConditionalGeneration,
        "whisper": WhisperForConditionalGeneration,
        "florence2": Florence2ForConditionalGeneration,
    }
    torch.manual_seed(seed)
    return classes[name](tiny_config(name)).eval()


def reference_output(name: str, model: PreTrainedModel, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """What transformers itself computes for the part of `model` the zoo builds."""
    with torch.no_grad():
        if name == "bart":
            return model.model.decoder(input_ids=inputs[0], encoder_hidden_states=inputs[1]).last_hidden_state
        if name == "whisper":
            return model.model.encoder(inputs[0]).last_hidden_state
        return model.model.get_image_features(inputs[0]).pooler_output
