#!/usr/bin/env python3
"""Compares a folder written by `temper convert` with transformers' own GGUF import of the same file.

    .venv/bin/python tools/gguf_check_hf.py FILE.gguf HF_DIR TRUTH.npz|- [FILE.gguf HF_DIR TRUTH.npz|- ...]

Prints one JSON object per (file, folder) pair, one per line:
- state_keys_equal, state_max_diff: parameters of `from_pretrained(HF_DIR)` vs
  `from_pretrained(dir, gguf_file=FILE)` (both float32);
- logits_max_diff: the two models' logits on a few token sequences;
- tokens_mismatch: strings whose ids differ between the tokenizers (transformers' GGUF
  conversion vs HF_DIR/tokenizer.json), with both encodings; texts, ref_ids: the strings compared
  and transformers' ids for them (for checks of other tokenizer implementations);
- chat_equal: the chat template renders the same conversation identically;
- truth_max_diff: with TRUTH.npz, max |converted - truth| over the arrays it holds (HF names).
Used by the Rust tests; exit status 0 whenever the comparison itself ran.
"""

import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

TEXTS = [
    "Hello world",
    "the quick brown fox jumps over the lazy dog",
    "  leading spaces, trailing   ",
    "Digits: 12345 67 8.90 and 2024-06-11",
    "héllo ünïcode 日本語 🤗 ñ",
    "tabs\tand\nnewlines\n\n\r\n  indented",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<think>reasoning</think> answer",
    "don't won't I'll they're WE'VE",
    "",
]
CHAT = [{"role": "user", "content": "What is 7 * 6?"}, {"role": "assistant", "content": "42"}]


def main() -> None:
    args = sys.argv[1:]
    if not args or len(args) % 3:
        sys.exit(__doc__)
    for i in range(0, len(args), 3):
        check(Path(args[i]), Path(args[i + 1]), None if args[i + 2] == "-" else np.load(args[i + 2]))


def check(gguf_path: Path, hf_dir: Path, truth) -> None:
    kw = dict(gguf_file=gguf_path.name)
    ref = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw).eval()
    ours = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    sr, so = ref.state_dict(), ours.state_dict()
    keys_equal = set(sr) == set(so)
    state_diff = max((sr[k] - so[k]).abs().max().item() for k in sr if k in so)

    tok_ref = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    tok_ours = AutoTokenizer.from_pretrained(hf_dir)
    mismatch, ref_ids = [], []
    for t in TEXTS:
        a, b = tok_ref(t).input_ids, tok_ours(t).input_ids
        ref_ids.append(a)
        if a != b:
            mismatch.append({"text": t, "transformers": a, "ours": b})
    chat_equal = tok_ref.apply_chat_template(CHAT, tokenize=False) == tok_ours.apply_chat_template(CHAT, tokenize=False)

    logits_diff = 0.0
    with torch.no_grad():
        for t in TEXTS[:4] + TEXTS[6:7]:
            ids = torch.tensor([tok_ref(t).input_ids])
            logits_diff = max(logits_diff, (ref(ids).logits - ours(ids).logits).abs().max().item())

    out = {
        "state_keys_equal": keys_equal,
        "state_max_diff": state_diff,
        "logits_max_diff": logits_diff,
        "tokens_mismatch": mismatch,
        "texts": TEXTS,
        "ref_ids": ref_ids,
        "chat_equal": chat_equal,
    }
    if truth is not None:
        out["truth_max_diff"] = max(float(np.abs(so[k].numpy() - truth[k]).max()) for k in truth.files)
        out["truth_count"] = len(truth.files)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
