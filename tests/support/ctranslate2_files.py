"""CTranslate2 Whisper directories written from a Hugging Face Whisper, for the reader's tests.

The layout is CTranslate2's (binary version 6, `WhisperSpec` revision 3), written here from
its description: q, k, v fused in `self_attention/linear_0` with a zero k bias; cross-attention
q in `attention/linear_0`, k and v fused in `attention/linear_1`; the output projection an
alias of the token embedding; int8 weights with one scale per row, int16 with one in all.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

DTYPE_IDS = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4, torch.bfloat16: 5}
TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>")


def tiny_whisper(vocab_size: int = 12, seed: int = 1) -> WhisperForConditionalGeneration:
    """A whole Whisper model of d_model 8, one layer each side, its encoder at the published
    1500 positions (what the zoo's example input needs)."""
    config = WhisperConfig(
        d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=16, decoder_ffn_dim=16, num_mel_bins=8, max_source_positions=1500, max_target_positions=6,
        vocab_size=vocab_size, pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=1,
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # biases are zero at init: make them count
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    return model


def listening_whisper() -> WhisperForConditionalGeneration:
    """`tiny_whisper` whose decoder listens to the encoder: its cross-attention scaled up (at
    init it barely moves the logits, and every utterance would decode alike)."""
    model = tiny_whisper()
    with torch.no_grad():
        for layer in model.model.decoder.layers:
            layer.encoder_attn.v_proj.weight.mul_(40.0)
            layer.encoder_attn.out_proj.weight.mul_(40.0)
    return model


def ct2_variables(model: WhisperForConditionalGeneration) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(CTranslate2 name -> tensor, alias -> variable) of `model`; scalars as 0-dim tensors."""
    config = model.config
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}

    def linear(ct2: str, hf: str, bias: bool = True) -> None:
        out[f"{ct2}/weight"] = state[f"{hf}.weight"]
        if bias:
            out[f"{ct2}/bias"] = state[f"{hf}.bias"]

    def norm(ct2: str, hf: str) -> None:
        out[f"{ct2}/gamma"], out[f"{ct2}/beta"] = state[f"{hf}.weight"], state[f"{hf}.bias"]

    def attention(ct2: str, hf: str, fused: bool) -> None:
        q, k, v = (state[f"{hf}.{p}_proj.weight"] for p in "qkv")
        qb, vb = state[f"{hf}.q_proj.bias"], state[f"{hf}.v_proj.bias"]
        if fused:
            out[f"{ct2}/linear_0/weight"] = torch.cat([q, k, v])
            out[f"{ct2}/linear_0/bias"] = torch.cat([qb, torch.zeros_like(qb), vb])
            linear(f"{ct2}/linear_1", f"{hf}.out_proj")
        else:
            out[f"{ct2}/linear_0/weight"], out[f"{ct2}/linear_0/bias"] = q, qb
            out[f"{ct2}/linear_1/weight"] = torch.cat([k, v])
            out[f"{ct2}/linear_1/bias"] = torch.cat([torch.zeros_like(vb), vb])
            linear(f"{ct2}/linear_2", f"{hf}.out_proj")

    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    out["encoder/position_encodings/encodings"] = state["model.encoder.embed_positions.weight"]
    norm("encoder/layer_norm", "model.encoder.layer_norm")
    out["decoder/embeddings/weight"] = state["model.decoder.embed_tokens.weight"]
    out["decoder/position_encodings/encodings"] = state["model.decoder.embed_positions.weight"]
    norm("decoder/layer_norm", "model.decoder.layer_norm")
    for stack, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            ct2, hf = f"{stack}/layer_{i}", f"model.{stack}.layers.{i}"
            attention(f"{ct2}/self_attention", f"{hf}.self_attn", True)
            norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            if stack == "decoder":
                attention(f"{ct2}/attention", f"{hf}.encoder_attn", False)
                norm(f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
            linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
            linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")
            norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")
    scalars = {"encoder/num_heads": (config.encoder_attention_heads, torch.int16),
               "decoder/num_heads": (config.decoder_attention_heads, torch.int16),
               "decoder/activation": (3, torch.int8), "decoder/alibi": (0, torch.int8),
               "decoder/alignment_heads": (1, torch.int16), "decoder/alignment_layer": (-1, torch.int16),
               "decoder/pre_norm": (1, torch.int8), "decoder/scale_embeddings": (0, torch.int8),
               "decoder/start_from_zero_embedding": (0, torch.int8)}
    out.update({name: torch.tensor(value, dtype=dtype) for name, (value, dtype) in scalars.items()})
    return out, {"decoder/projection/weight": "decoder/embeddings/weight"}


def quantizable(name: str) -> bool:
    """Weights that have a scale slot in CTranslate2's spec: linears, convolutions, the embedding."""
    return name.endswith("/weight")


def convert(variables: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
            quantize: str | None = None) -> dict[str, torch.Tensor]:
    """Floats cast to `dtype`; with `quantize` ("int8" or "int16") the quantizable weights stored
    as CTranslate2's quantizer does, with their `_scale`."""
    out = {}
    for name, t in variables.items():
        if t.dim() == 0 or not t.is_floating_point():
            out[name] = t
        elif quantize == "int8" and quantizable(name):
            rows = t.reshape(t.shape[0], -1)
            amax = rows.abs().amax(dim=1)
            scale = 127.0 / torch.where(amax == 0, 127.0, amax)  # a zero row (padding) keeps scale 1, as CTranslate2's
            out[name] = torch.round(rows * scale[:, None]).to(torch.int8).reshape(t.shape)
            out[f"{name}_scale"] = scale.to(torch.float32)
        elif quantize == "int16" and quantizable(name):
            scale = torch.tensor(2.0**10 / t.abs().max().item(), dtype=torch.float32)
            out[name] = torch.round(t * scale).clamp(-32768, 32767).to(torch.int16)
            out[f"{name}_scale"] = scale
        else:
            out[name] = t.to(dtype)
    return out


def string(text: str) -> bytes:
    data = text.encode() + b"\0"
    return struct.pack("<H", len(data)) + data


def variable_bytes(name: str, t: torch.Tensor) -> bytes:
    t = t.contiguous()
    raw = t.view(torch.int16) if t.dtype in (torch.float16, torch.bfloat16) else t
    data = raw.numpy().tobytes()
    return (string(name) + struct.pack("<B", t.dim()) + struct.pack(f"<{t.dim()}I", *t.shape)
            + struct.pack("<BI", DTYPE_IDS[t.dtype], len(data)) + data)


def model_bin(variables: dict[str, torch.Tensor], aliases: dict[str, str], spec: str = "WhisperSpec",
              version: int = 6, revision: int = 3) -> bytes:
    """model.bin's bytes: the variables in sorted order, as CTranslate2 writes them, then the aliases."""
    parts = [struct.pack("<I", version), string(spec), struct.pack("<II", revision, len(variables))]
    parts += [variable_bytes(name, variables[name]) for name in sorted(variables)]
    parts.append(struct.pack("<I", len(aliases)))
    parts += [string(a) + string(t) for a, t in aliases.items()]
    return b"".join(parts)


def write_ct2(directory: Path, model: WhisperForConditionalGeneration, dtype: torch.dtype = torch.float32,
              quantize: str | None = None, tokens: tuple[str, ...] | None = None) -> Path:
    """A CTranslate2 directory of `model`: model.bin, config.json, vocabulary.txt."""
    variables, aliases = ct2_variables(model)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.bin").write_bytes(model_bin(convert(variables, dtype, quantize), aliases))
    write_side_files(directory, model.config.vocab_size, tokens)
    return directory


def write_side_files(directory: Path, vocab_size: int, tokens: tuple[str, ...] | None = None) -> None:
    tokens = tokens if tokens is not None else (*TOKENS, *(f"t{i}" for i in range(vocab_size - len(TOKENS))))
    (directory / "vocabulary.txt").write_text("".join(f"{t}\n" for t in tokens))
    (directory / "config.json").write_text(json.dumps({
        "alignment_heads": [[0, 1]], "lang_ids": [], "suppress_ids": [2], "suppress_ids_begin": [0]}))
