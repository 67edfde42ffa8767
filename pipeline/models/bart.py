"""`bart`: the BART decoder stack — token ids and encoder hidden states in, last hidden state out."""

from __future__ import annotations

from typing import Any

import torch
from torch.export import Dim
from transformers import BartConfig
from transformers.models.bart.modeling_bart import BartDecoder

from pipeline.models.spec import ConfigInt, ModelFamily

DECODER_LENGTH = 128
# A source document is usually longer than the text generated from it.
ENCODER_LENGTH = 256
# Ids below this are <s>, <pad>, </s>, <unk>.
FIRST_WORD_ID = 4


class BartDecoderModel(torch.nn.Module):
    """BartDecoder without cache: (input_ids, encoder_hidden_states) -> last_hidden_state."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.decoder = BartDecoder(config)

    def forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, use_cache=False)
        return out.last_hidden_state


def make_inputs(config: BartConfig, preprocessor: dict[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    # Learned positions bound both lengths (a shrunken config may allow fewer than the defaults).
    decoder_length = min(DECODER_LENGTH, config.max_position_embeddings)
    encoder_length = min(ENCODER_LENGTH, config.max_position_embeddings)
    input_ids = torch.randint(FIRST_WORD_ID, config.vocab_size, (1, decoder_length), generator=gen)
    input_ids[:, 0] = config.decoder_start_token_id
    # Encoder outputs leave a LayerNorm, so unit-variance features are their natural scale.
    encoder_hidden_states = torch.randn(1, encoder_length, config.d_model, generator=gen)
    return input_ids, encoder_hidden_states


def make_dynamic_shapes(config: BartConfig) -> tuple[dict[int, Any], dict[int, Any]]:
    # Learned positions bound both lengths; 2 keeps export from specializing length 1.
    limit = config.max_position_embeddings
    decoder_length = Dim("decoder_length", min=2, max=limit)
    encoder_length = Dim("encoder_length", min=2, max=limit)
    return {1: decoder_length}, {1: encoder_length}


FAMILY = ModelFamily(
    name="bart",
    variants=("base", "large"),
    default_variant="base",
    model_type="bart",
    config_class=BartConfig,
    make_module=BartDecoderModel,
    make_inputs=make_inputs,
    signature=lambda c: (
        c.d_model, c.decoder_layers, c.decoder_attention_heads, c.decoder_ffn_dim,
        c.vocab_size, c.max_position_embeddings,
    ),
    hidden_size=lambda c: c.d_model,
    make_dynamic_shapes=make_dynamic_shapes,
    # BartModel ties the decoder's token embedding to `shared` and saves it there.
    weight_aliases={"decoder.embed_tokens.weight": ("shared.weight",)},
    sizes=(
        ConfigInt("d_model"), ConfigInt("decoder_layers", repeats=True), ConfigInt("decoder_attention_heads"),
        ConfigInt("decoder_ffn_dim"), ConfigInt("vocab_size"), ConfigInt("max_position_embeddings"),
        # Token ids: the embedding's padding row, and the first token of the example inputs.
        ConfigInt("pad_token_id", minimum=0, below="vocab_size"),
        ConfigInt("decoder_start_token_id", minimum=0, below="vocab_size"),
    ),
    divides=(("decoder_attention_heads", "d_model"),),
)
