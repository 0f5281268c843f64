#!/usr/bin/env python3
"""A model folder with another folder's architecture and tokenizer and seeded random weights.

  python tools/random_weights.py --like DIR --out DIR [--seed 0]

Copies DIR's config.json, tokenizer and generation files as they are, and writes
model.safetensors (f32) from transformers' own initialisation of that config under
torch.manual_seed(seed), with transformers' parameter names (no lm_head when the embeddings are
tied). Used where the real weights cannot travel (scripts/gpu-check.sh on a GPU machine): both
temper and transformers load the result, so they can be compared on the same weights.
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
          "special_tokens_map.json", "chat_template.jinja")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", required=True, help="a model folder (config.json + tokenizer)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    config = AutoConfig.from_pretrained(args.like)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    tied = json.load(open(os.path.join(args.like, "config.json"))).get("tie_word_embeddings", False)
    if tied:
        state.pop("lm_head.weight", None)
    os.makedirs(args.out, exist_ok=True)
    for name in COPIED:
        src = os.path.join(args.like, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(args.out, name))
    tmp = os.path.join(args.out, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(args.out, "model.safetensors"))
    n = sum(v.numel() for v in state.values())
    print(f"{args.out}: {n / 1e6:.1f}M random parameters (seed {args.seed}) shaped like {args.like}")


if __name__ == "__main__":
    main()
