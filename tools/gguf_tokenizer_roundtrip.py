#!/usr/bin/env python3
"""Round trip of a real HF tokenizer through GGUF metadata, for gguf_tokenizer_real.rs.

    .venv/bin/python tools/gguf_tokenizer_roundtrip.py make TOKENIZER_DIR ARCH PRE OUT.gguf
    .venv/bin/python tools/gguf_tokenizer_roundtrip.py compare TOKENIZER_DIR OUT.gguf OURS_DIR [TEXTS.jsonl] [--no-transformers]

`make` writes a GGUF holding only the tokenizer of TOKENIZER_DIR (tokenizer.json +
tokenizer_config.json) the way llama.cpp's convert_hf_to_gguf.py stores it: tokens by id (gaps as
`[PADn]`, type UNUSED), added special tokens as CONTROL, other added tokens as USER_DEFINED, the
merges as "a b" strings, `tokenizer.ggml.pre` = PRE, special ids and the chat template from
tokenizer_config.json.

`compare` encodes a set of texts (hand-written edge cases, plus the question and answer of the
first 40 records of TEXTS.jsonl if given) three ways and prints one JSON object:
- vs_original: texts whose ids from OURS_DIR/tokenizer.json differ from the original
  tokenizer.json (both without added BOS/EOS: the original files differ in that on purpose);
- vs_transformers: texts whose ids (defaults, with BOS/EOS handling) differ from transformers'
  own GGUF tokenizer conversion of OUT.gguf (skipped with --no-transformers: that conversion takes
  about 30 s for Llama-3's 280k merges);
- n_texts.
"""

import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

EDGE = [
    "Hello world",
    "  leading and trailing spaces   ",
    "Numbers: 1 12 123 1234 12345 3.14159 1,000,000 2024-06-11",
    "don't won't I'll they're WE'VE it's",
    "héllo ünïcode 日本語 中文 한국어 русский العربية 🤗👍🏽",
    "e\u0301 vs \u00e9 (NFD vs NFC)",
    "tabs\tand\nnewlines\n\n\r\n  indented\n    code",
    "def f(x):\n    return x**2  # comment\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "$$\\frac{a}{b} = \\sqrt{x^2 + y^2}$$ \\boxed{42}",
    "!!!??? ... --- ___ *** ///",
    "",
]


def make(tok_dir: Path, arch: str, pre: str, out: Path) -> None:
    import gguf

    tj = json.loads((tok_dir / "tokenizer.json").read_text())
    tc = json.loads((tok_dir / "tokenizer_config.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    added = {t["id"]: t for t in tj["added_tokens"]}
    size = max(list(vocab.values()) + list(added)) + 1
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w = gguf.GGUFWriter(out, arch=arch)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    for key, add in [("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id), ("pad_token", w.add_pad_token_id)]:
        tok = tc.get(key)
        if isinstance(tok, dict):
            tok = tok.get("content")
        if tok is not None:
            add(ids[tok])
    # llama.cpp adds BOS for Llama-3 vocabularies and not for Qwen's.
    w.add_add_bos_token(pre in ("llama-bpe", "llama3"))
    if tc.get("chat_template"):
        w.add_chat_template(tc["chat_template"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def compare(tok_dir: Path, gguf_file: Path, ours_dir: Path, texts_file: Path | None, with_transformers: bool) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    texts = list(EDGE)
    if texts_file is not None:
        for line in texts_file.read_text().splitlines()[:40]:
            rec = json.loads(line)
            texts += [rec["question"], rec["answer"]]
    original = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    ours_raw = Tokenizer.from_file(str(ours_dir / "tokenizer.json"))
    ours = AutoTokenizer.from_pretrained(ours_dir)
    ref = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name) if with_transformers else None
    vs_original, vs_transformers = [], []
    for t in texts:
        a, b = original.encode(t, add_special_tokens=False).ids, ours_raw.encode(t, add_special_tokens=False).ids
        if a != b:
            vs_original.append({"text": t, "original": a, "ours": b})
        if ref is None:
            continue
        a, b = ref(t).input_ids, ours(t).input_ids
        if a != b:
            vs_transformers.append({"text": t, "transformers": a, "ours": b})
    out = {"n_texts": len(texts), "vs_original": vs_original}
    if ref is not None:
        out["vs_transformers"] = vs_transformers
    print(json.dumps(out))


def main() -> None:
    if len(sys.argv) >= 6 and sys.argv[1] == "make":
        make(Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "compare":
        flags = [a for a in sys.argv[5:] if a.startswith("--")]
        rest = [a for a in sys.argv[5:] if not a.startswith("--")]
        compare(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), Path(rest[0]) if rest else None, "--no-transformers" not in flags)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
