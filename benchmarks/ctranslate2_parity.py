"""A CTranslate2 Whisper directory read by pipeline.models against CTranslate2 itself: the
encoder outputs of both on the same seeded log-mel, and their greedy decoding.

    python benchmarks/ctranslate2_parity.py DIR [--seed 0] [--batch 2] [--steps 8]

Needs the `ctranslate2` package (not a dependency of this product: install it to run this
check). Prints the largest output, the max abs and relative L2 difference of the encoder
outputs and of the first decoder step's log-probabilities, and the greedy tokens of both from
the start-of-transcript token.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="a CTranslate2 Whisper directory (model.bin, config.json, vocabulary)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="greedy decoding steps (default 8)")
    args = parser.parse_args(argv)
    try:
        import ctranslate2  # after --help
    except ImportError:
        print("ctranslate2_parity.py: needs the ctranslate2 package (pip install ctranslate2)", file=sys.stderr)
        return 1
    import numpy as np
    import torch

    from pipeline.evaluation.metrics import compare
    from pipeline.models.ctranslate2 import read_ctranslate2, whole_model

    checkpoint = read_ctranslate2(args.directory)
    model = whole_model(checkpoint)
    config = checkpoint.config
    print(f"read {checkpoint.directory}: {checkpoint.description}, sha256 {checkpoint.sha256[:16]}...")
    # Log-mel features of Whisper's scale (about -1 to 1.5), 30 s windows.
    mel = torch.rand(args.batch, config.num_mel_bins, 2 * config.max_source_positions,
                     generator=torch.Generator().manual_seed(args.seed)) * 2.5 - 1.0
    reference = ctranslate2.models.Whisper(str(checkpoint.directory), device="cpu", compute_type="float32")
    theirs = torch.from_numpy(np.array(reference.encode(ctranslate2.StorageView.from_array(mel.numpy()))))
    with torch.no_grad():
        ours = model.model.encoder(mel).last_hidden_state
    c = compare(ours, theirs)
    print(f"encoder {tuple(ours.shape)}: max |x| {theirs.abs().max():.3g}, max abs diff {c['max_abs']:.3g}, "
          f"rel L2 {c['rel_l2']:.3g}")

    # Greedy decoding from <|startoftranscript|><|notimestamps|> in both. CTranslate2 masks
    # tokens its decoding rules forbid (returned as the lowest float): the same mask is applied
    # to ours, and logits are compared where it allows them.
    prompt = [config.decoder_start_token_id] + [checkpoint.tokens.index(t) for t in ("<|notimestamps|>",)
                                                 if t in checkpoint.tokens]
    results = reference.generate(ctranslate2.StorageView.from_array(mel.numpy()), [prompt] * args.batch,
                                 beam_size=1, max_length=args.steps, suppress_blank=False, suppress_tokens=[],
                                 return_logits_vocab=True)
    with torch.no_grad():
        hidden = model.model.encoder(mel).last_hidden_state
    worst, same = 0.0, 0
    for i, r in enumerate(results):
        tokens = torch.tensor([prompt])
        for step, theirs_logits in enumerate(r.logits[0]):
            theirs_logits = torch.from_numpy(np.array(theirs_logits)).float().reshape(-1)
            with torch.no_grad():
                logits = model(encoder_outputs=(hidden[i:i + 1],), decoder_input_ids=tokens).logits[0, -1]
            allowed = theirs_logits > -1e30
            worst = max(worst, (logits - theirs_logits)[allowed].abs().max().item())
            token = logits.masked_fill(~allowed, -torch.inf).argmax()
            tokens = torch.cat([tokens, token.reshape(1, 1)], dim=1)
        ours_tokens = tokens[0, len(prompt):].tolist()
        same += ours_tokens == r.sequences_ids[0]
        print(f"input {i}: ours {ours_tokens}, CTranslate2 {r.sequences_ids[0]}")
    print(f"decoder logits (vocabulary {config.vocab_size}): max abs diff {worst:.3g}; greedy tokens the same "
          f"for {same} of {len(results)} inputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
