"""The task-level check of a whole Whisper: the same greedy decode from eager's encoder output
and from the delegated program's, token for token.

A checkpoint that holds the decoder (a CTranslate2 directory: `pipeline.models.ctranslate2`;
a Hugging Face directory with the decoder's weights and its tokenizer files:
`pipeline.models.whisper.whole_model`) decodes each utterance of the example inputs twice
with the checkpoint's own decoder at the report's dtype: from the encoder output of eager
PyTorch and from the program's. The check passes when the tokens are identical. The decode
is greedy and deterministic:
- the prompt is <|startoftranscript|><|notimestamps|> for an English-only model (vocabulary
  under 51,865 tokens), <|startoftranscript|><|en|><|transcribe|><|notimestamps|> otherwise;
- every special token (`<|...|>`) but <|endoftext|> is suppressed, and the checkpoint's
  `suppress_tokens`, and at the first step its `begin_suppress_tokens` (a blank, <|endoftext|>);
- the highest logit wins (the lowest id among equals); it stops at <|endoftext|>, after
  MAX_TOKENS tokens or at the decoder's last position.
Tokens become text by the vocabulary's byte-level BPE (GPT-2's byte-to-character map).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from pipeline.evaluation.metrics import compare

MAX_TOKENS = 100
MULTILINGUAL_VOCABULARY = 51_865
END_OF_TEXT = "<|endoftext|>"
START_OF_TRANSCRIPT = "<|startoftranscript|>"
NO_TIMESTAMPS = "<|notimestamps|>"
MULTILINGUAL_PROMPT = ("<|en|>", "<|transcribe|>")


@dataclass
class WhisperDecoder:
    """A whole Whisper's decoder with what its greedy decode needs."""

    model: Any  # WhisperForConditionalGeneration, eval mode, at the report's dtype
    tokens: tuple[str, ...]  # the vocabulary, by id
    prompt: tuple[int, ...]
    end: int
    suppressed: tuple[int, ...]
    suppressed_first: tuple[int, ...]
    max_tokens: int

    @classmethod
    def of(cls, model, tokens: Sequence[str], max_tokens: int = MAX_TOKENS) -> WhisperDecoder:
        """The decoder of `model` (a `WhisperForConditionalGeneration`) with its vocabulary
        `tokens`; ValueError when the vocabulary lacks Whisper's prompt tokens."""
        tokens = tuple(tokens)
        config = model.config
        if len(tokens) != config.vocab_size:
            raise ValueError(f"tokens: {len(tokens)}, the model's vocabulary {config.vocab_size}")
        ids = {token: i for i, token in reversed(list(enumerate(tokens)))}
        names = [START_OF_TRANSCRIPT]
        if config.vocab_size >= MULTILINGUAL_VOCABULARY:
            names += MULTILINGUAL_PROMPT
        names.append(NO_TIMESTAMPS)
        missing = [name for name in [*names, END_OF_TEXT] if name not in ids]
        if missing:
            raise ValueError(f"tokens: no {', '.join(missing)}: not a Whisper vocabulary")
        end = ids[END_OF_TEXT]
        special = {i for i, t in enumerate(tokens) if t.startswith("<|") and t.endswith("|>")} - {end}
        suppressed = special | {i for i in config.suppress_tokens or () if 0 <= i < len(tokens)}
        first = {i for i in config.begin_suppress_tokens or () if 0 <= i < len(tokens)}
        prompt = tuple(ids[name] for name in names)
        limit = min(max_tokens, config.max_target_positions - len(prompt))
        if limit < 1:
            raise ValueError(f"the decoder has {config.max_target_positions} positions: no room after the prompt")
        return cls(model, tokens, prompt, end, tuple(sorted(suppressed)), tuple(sorted(first)), limit)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def decode(self, hidden: torch.Tensor) -> list[list[int]]:
        """The greedy tokens (prompt and <|endoftext|> left out) of each row of the encoder
        output `hidden` (B, frames, d_model), all rows decoded in one batch: a row's tokens
        depend on its own encoder output only."""
        if hidden.dim() != 3 or hidden.shape[-1] != self.model.config.d_model:
            raise ValueError(f"hidden: expected (batch, frames, {self.model.config.d_model}), got {list(hidden.shape)}")
        # A step is a few hundred ops on a handful of rows: one thread spares each op the
        # thread pool's hand-off (15x faster on a busy 2-core machine; the same tokens).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                return self._greedy(hidden.to(self.dtype))
        finally:
            torch.set_num_threads(threads)

    def _greedy(self, hidden: torch.Tensor) -> list[list[int]]:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        decoder, project = self.model.model.decoder, self.model.proj_out
        rows = hidden.shape[0]
        step = torch.tensor([self.prompt] * rows)
        # Self-attention keys grow by a token a step; cross-attention's are made once.
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        out: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        for i in range(self.max_tokens):
            result = decoder(input_ids=step, encoder_hidden_states=hidden, cache=cache, use_cache=True)
            logits = project(result.last_hidden_state[:, -1]).float()
            logits[:, list(self.suppressed)] = -torch.inf
            if i == 0 and self.suppressed_first:
                logits[:, list(self.suppressed_first)] = -torch.inf
            tokens = torch.argmax(logits, dim=-1).tolist()  # the first of equal maxima
            for b, token in enumerate(tokens):
                if not done[b]:
                    done[b] = token == self.end
                    if not done[b]:
                        out[b].append(token)
            if all(done):
                break
            # A finished row is fed <|endoftext|> until the others end; its tokens are kept no more.
            step = torch.tensor([[self.end if done[b] else tokens[b]] for b in range(rows)])
        return out

    def text(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`: their byte-level BPE pieces joined and read as UTF-8."""
        decoder = _byte_decoder()
        data = bytearray()
        for token in tokens:
            for char in self.tokens[token]:
                byte = decoder.get(char)
                data.extend(char.encode("utf-8") if byte is None else bytes([byte]))
        return data.decode("utf-8", errors="replace").strip()


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE map, reversed: each byte is a printable character, the printable
    Latin-1 bytes themselves, the others 256 upward in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[chr(byte)] = byte
        else:
            mapping[chr(256 + extra)] = byte
            extra += 1
    return mapping


def decoder_of(spec) -> WhisperDecoder | None:
    """The decoder of a whisper spec built from a checkpoint that holds one, at the spec's
    dtype: CTranslate2's whole model, or a Hugging Face directory's with its decoder weights
    and tokenizer files (`pipeline.models.whisper.whole_model`). None when there is none
    (seeded weights, a Hugging Face directory without decoder weights or without vocabulary
    files, another model). The checkpoint is read again with the spec's sha256: CheckpointError
    when its files changed since the spec was built."""
    form = getattr(spec, "checkpoint_format", None)
    if spec.name != "whisper" or form not in ("ctranslate2", "huggingface"):
        return None
    # A Hugging Face directory is whole when the build read a vocabulary with it.
    if form == "huggingface" and getattr(spec, "checkpoint_tokens", None) is None:
        return None
    from pipeline.models import ctranslate2, whisper
    from pipeline.models.checkpoint import read_checkpoint

    dtype = next(p.dtype for p in spec.module.parameters() if p.is_floating_point())
    if form == "ctranslate2":
        checkpoint = ctranslate2.read_ctranslate2(spec.checkpoint, spec.checkpoint_sha256)
        return WhisperDecoder.of(ctranslate2.whole_model(checkpoint).to(dtype), checkpoint.tokens)
    stored = read_checkpoint(spec.checkpoint, whisper.FAMILY, spec.checkpoint_sha256)
    # The encoder is the spec's module, read from these files when it was built.
    return WhisperDecoder.of(whisper.whole_model(stored, spec.module.encoder, dtype), stored.tokens)


def agreement(a: Sequence[int], b: Sequence[int]) -> tuple[float, int | None]:
    """(share of positions with the same token over the longer sequence, the first position
    that differs or None)."""
    longest = max(len(a), len(b))
    same = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return (1.0 if longest == 0 else same / longest), first


def check_transcripts(decoder: WhisperDecoder, spec, eager: torch.Tensor, program: torch.Tensor,
                      fp64: torch.Tensor, program_name: str = "delegated",
                      eager_float32: torch.Tensor | None = None) -> dict[str, Any]:
    """Decode each utterance from `eager`'s encoder output and from `program`'s; the report
    section: per utterance both texts and tokens, their agreement and each encoder output's
    max abs error against `fp64` (and float32 eager's, for a half dtype, `eager_float32`).
    `identical` (the verdict) when every utterance's tokens are the same."""
    from pipeline.models.audio import shipped_utterances

    if not (eager.shape == program.shape == fp64.shape) or eager.dim() != 3:
        raise ValueError(f"encoder outputs of shapes {list(eager.shape)}, {list(program.shape)}, "
                         f"{list(fp64.shape)}: expected one (batch, frames, width)")
    files = spec.audio or tuple(f"example input {b}" for b in range(eager.shape[0]))
    if len(files) != eager.shape[0]:
        raise ValueError(f"{len(files)} audio files, {eager.shape[0]} encoder output rows")
    spoken = {str(path): text for path, text in shipped_utterances()}
    both = decoder.decode(torch.cat([eager, program.to(eager.dtype)]))
    from_eager, from_program = both[:eager.shape[0]], both[eager.shape[0]:]
    rows = []
    for b, (path, want, got) in enumerate(zip(files, from_eager, from_program)):
        share, first = agreement(want, got)
        row = {
            "audio": os.path.basename(path), "path": path, "spoken": spoken.get(path),
            "text_eager": decoder.text(want), f"text_{program_name}": decoder.text(got),
            "tokens_eager": want, f"tokens_{program_name}": got,
            "tokens_identical": want == got, "token_agreement": share, "first_difference": first,
            f"encoder_{program_name}_vs_fp64_max_abs": compare(program[b], fp64[b])["max_abs"],
            "encoder_eager_vs_fp64_max_abs": compare(eager[b], fp64[b])["max_abs"],
        }
        if eager_float32 is not None:
            row["encoder_eager_float32_vs_fp64_max_abs"] = compare(eager_float32[b], fp64[b])["max_abs"]
        rows.append(row)
    return {
        "program": program_name,
        "decode": (f"greedy, at most {decoder.max_tokens} tokens, prompt "
                   f"{''.join(decoder.tokens[i] for i in decoder.prompt)}, special tokens suppressed"),
        "dtype": str(decoder.dtype).removeprefix("torch."),
        "utterances": rows,
        "identical": all(r["tokens_identical"] for r in rows),
    }


def encoder_output(outputs) -> torch.Tensor:
    """The encoder's hidden states from a module's or a runtime's outputs (a tensor, or a
    list or tuple holding one)."""
    if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
        outputs = outputs[0]
    if not isinstance(outputs, torch.Tensor):
        raise TypeError(f"expected the encoder's output tensor, got {type(outputs).__name__}")
    return outputs


def transcripts_for(spec, outputs: dict, program_name: str = "delegated",
                    progress=lambda line: None) -> dict[str, Any] | None:
    """The transcript check of `spec`'s example inputs, given the encoder outputs `outputs`
    ("eager", "fp64", `program_name`, optionally "eager_float32"); None when the spec's
    checkpoint holds no decoder."""
    decoder = decoder_of(spec)
    if decoder is None:
        return None
    progress(f"[{spec.name}] decoding {spec.example_inputs[0].shape[0]} utterance(s) from eager's and the "
             f"{program_name} program's encoder output ...")
    single = outputs.get("eager_float32")
    return check_transcripts(decoder, spec, encoder_output(outputs["eager"]), encoder_output(outputs[program_name]),
                             encoder_output(outputs["fp64"]), program_name,
                             None if single is None else encoder_output(single))


def verdict_line(section: dict[str, Any]) -> str:
    """One line: how many utterances decode to the same tokens."""
    rows = section["utterances"]
    same = sum(r["tokens_identical"] for r in rows)
    return (f"transcripts: {same}/{len(rows)} utterances decode to identical tokens from eager's and the "
            f"{section['program']} program's encoder output ({section['dtype']} decoder)")
