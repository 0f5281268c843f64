#!/usr/bin/env python3
"""Reference renderings of chat templates and tokenizations, by transformers.

For each template file NAME.jinja in --templates, builds a small BPE tokenizer (trained here with the
`tokenizers` library, special tokens <|endoftext|> <|im_start|> <|im_end|> <think> </think>), saves it
with that chat template as an HF tokenizer folder --out/NAME/ (tokenizer.json, tokenizer_config.json,
chat_template.jinja as transformers writes them), then records with AutoTokenizer:
  apply_chat_template(conv, tokenize=False, add_generation_prompt=g) for every conversation and g,
  encode/decode of sample texts.
Writes --out/NAME/reference.json. Usage:
  .venv/bin/python tools/model_chat_reference.py --templates DIR --out DIR
"""
import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

CORPUS = [
    "Hello! How are you today? I am fine, thanks.",
    "What is 2+2? The answer is 4. And 3+3 is 6.",
    "Solve for x: 3x + 5 = 20, so x = 5.",
    "You are a helpful assistant. Think step by step.",
    "Ünïcödé “quotes” and newlines\n\ttabs {braces} {{ jinja }} émoji 🎉",
    "The quick brown fox jumps over the lazy dog.",
] * 20

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    [
        {"role": "user", "content": "Solve x"},
        {"role": "assistant", "content": "<think>\nreason here\n</think>\n\nx = 5"},
        {"role": "user", "content": "skip this? no: more please"},
        {"role": "assistant", "content": "  a banana!  "},
    ],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "stop"},
        {"role": "user", "content": "never shown by the features template"},
    ],
    [{"role": "user", "content": "Ünïcödé “quotes” and\nnewlines\t{braces} {{ jinja }} {% raw %} \"q\" \\ é"}],
]

TEXTS = ["Hello! How are you?", "x = 5\n\tÜnïcödé 🎉", "<|im_start|>user\nhi<|im_end|>\n", " leading space"]


def build_tokenizer(bos_post_processor):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if bos_post_processor:
        bos = tok.token_to_id("<|im_start|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for fname in sorted(os.listdir(args.templates)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[: -len(".jinja")]
        template = open(os.path.join(args.templates, fname), encoding="utf-8").read()
        smol_like = name == "smollm2"
        fast = PreTrainedTokenizerFast(
            tokenizer_object=build_tokenizer(bos_post_processor=smol_like),
            bos_token="<|im_start|>" if smol_like else None,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token="<|endoftext|>" if smol_like else None,
        )
        fast.chat_template = template
        d = os.path.join(args.out, name)
        fast.save_pretrained(d)
        tok = AutoTokenizer.from_pretrained(d)
        ref = {"conversations": CONVERSATIONS, "rendered": [], "texts": TEXTS, "encoded": [], "encoded_plain": [],
               "decoded": [], "decoded_skip": [], "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
               "pad_id": tok.pad_token_id, "rendered_no_thinking": None}
        for conv in CONVERSATIONS:
            for g in (False, True):
                ref["rendered"].append(tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=g))
        if name == "qwen3":
            ref["rendered_no_thinking"] = tok.apply_chat_template(
                CONVERSATIONS[1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=True)
            ref["encoded"].append(ids)
            ref["encoded_plain"].append(tok.encode(text, add_special_tokens=False))
            ref["decoded"].append(tok.decode(ids, skip_special_tokens=False))
            ref["decoded_skip"].append(tok.decode(ids, skip_special_tokens=True))
        with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
            json.dump(ref, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
