#!/usr/bin/env python3
"""Writes tiny random GGUF models (llama, qwen2, qwen3) and deliberately broken GGUF files, for
crates/temper-model/tests/gguf_convert_tiny.rs.

    .venv/bin/python tools/gguf_make_tiny.py OUT_DIR

Each model: hidden 64, 4 heads / 2 KV heads (head dim 16; 128 for qwen3, which like the real
Qwen3 has head_dim != hidden / heads and which transformers' GGUF import assumes), FFN 256, 2 layers, a 300-token
byte-level BPE vocabulary (256 bytes + 40 merges learned on a small text + 4 added tokens), a
ChatML template, and tensors in a mix of ggml types (F32, F16, BF16, Q4_0..Q8_0, Q4_K, Q6_K) as
llama.cpp writes them: the llama file stores Q/K rows permuted with llama.cpp's own `permute`.
Beside each model, `tiny-ARCH.truth.npz` holds the llama file's Q/K projections in HF row order
(F32/F16 stored, so exact), to check the un-permutation independently of transformers.

Broken files: bad-arch (architecture falcon), bad-quant (an IQ4_NL tensor), missing-tensor (a
qwen2 q bias left out), bad-shape (a K projection with too many rows), spm-tokenizer (a
SentencePiece tokenizer, unsupported).
"""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

HIDDEN, HEADS, KV_HEADS, HEAD_DIM_DEFAULT, FFN, LAYERS = 64, 4, 2, 16, 256, 2
CORPUS = (
    "the quick brown fox jumps over the lazy dog. the dog sleeps; the fox thinks. "
    "there is a theory that the other three think the same thing at the same time. "
    "numbers like 12345 and 2024 appear in the text, then the end."
)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4)]


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train_bpe(n_merges: int) -> tuple[list[str], list[str]]:
    """Byte-level BPE on CORPUS (words split at spaces, a space kept in front as GPT-2 does)."""
    b2u = bytes_to_unicode()
    words = Counter()
    for i, w in enumerate(CORPUS.split(" ")):
        w = (" " if i else "") + w
        words[tuple(b2u[b] for b in w.encode())] += 1
    vocab = [b2u[b] for b in range(256)]
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        vocab.append(a + b)
        new = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += c
        words = new
    return vocab, merges


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (HF row order -> GGUF row order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(rng, qtype, rows, cols, scale_fields, lo=1e-4, hi=1e-3):
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in scale_fields:
        s = (rng.uniform(lo, hi, n) * rng.choice([-1.0, 1.0], n)).astype(np.float16)
        raw[:, off:off + 2] = s.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


def add(w, name, data, qtype):
    """Adds `data` (f32, HF shape) stored as `qtype`."""
    if qtype == T.F32:
        w.add_tensor(name, data.astype(np.float32))
    elif qtype == T.F16:
        w.add_tensor(name, data.astype(np.float16))
    else:
        raw = gguf.quants.quantize(data.astype(np.float32), qtype)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)


def write_model(path: Path, arch: str, rng, *, pre="qwen2", broken=None):
    HEAD_DIM = 128 if arch == "qwen3" else HEAD_DIM_DEFAULT
    vocab, merges = train_bpe(40)
    tokens = vocab + [s for s, _ in SPECIALS]
    types = [1] * len(vocab) + [t for _, t in SPECIALS]
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0 if arch != "llama" else 10000.0)
    if arch == "qwen3":
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    if arch == "llama":
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama" if broken == "spm-tokenizer" else "gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>") if arch == "llama" else tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(arch == "llama")
    w.add_chat_template(CHAT_TEMPLATE)

    def rnd(*shape, s=0.05):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    truth = {}
    add(w, "token_embd.weight", rnd(n_vocab, HIDDEN, s=0.5), T.Q8_0)
    for l in range(LAYERS):
        p = f"blk.{l}."
        add(w, p + "attn_norm.weight", 1 + rnd(HIDDEN), T.F32)
        add(w, p + "ffn_norm.weight", 1 + rnd(HIDDEN), T.F32)
        q = rnd(HEADS * HEAD_DIM, HIDDEN, s=0.2)
        k_rows = KV_HEADS * HEAD_DIM + (HEAD_DIM if broken == "bad-shape" else 0)
        k = rnd(k_rows, HIDDEN, s=0.2).astype(np.float16).astype(np.float32)
        if arch == "llama":
            truth[f"model.layers.{l}.self_attn.q_proj.weight"] = q
            truth[f"model.layers.{l}.self_attn.k_proj.weight"] = k
            add(w, p + "attn_q.weight", llama_cpp_permute(q, HEADS), T.F32)
            add(w, p + "attn_k.weight", llama_cpp_permute(k, KV_HEADS) if broken != "bad-shape" else k, T.F16)
        else:
            add(w, p + "attn_q.weight", q, T.Q4_0)
            add(w, p + "attn_k.weight", k, T.Q5_1)
        add(w, p + "attn_v.weight", rnd(KV_HEADS * HEAD_DIM, HIDDEN, s=0.2), T.F16)
        add(w, p + "attn_output.weight", rnd(HIDDEN, HEADS * HEAD_DIM, s=0.2), T.Q8_0)
        if arch == "qwen2":
            if not (broken == "missing-tensor" and l == 1):
                add(w, p + "attn_q.bias", rnd(HEADS * HEAD_DIM, s=0.5), T.F32)
            add(w, p + "attn_k.bias", rnd(KV_HEADS * HEAD_DIM, s=0.5), T.F32)
            add(w, p + "attn_v.bias", rnd(KV_HEADS * HEAD_DIM, s=0.5), T.F32)
        if arch == "qwen3":
            add(w, p + "attn_q_norm.weight", 1 + rnd(HEAD_DIM, s=0.2), T.F32)
            add(w, p + "attn_k_norm.weight", 1 + rnd(HEAD_DIM, s=0.2), T.F32)
        if broken == "bad-quant" and l == 0:
            raw = random_blocks(rng, T.IQ4_NL, FFN, HIDDEN, [0])
            w.add_tensor(p + "ffn_gate.weight", raw, raw_shape=raw.shape, raw_dtype=T.IQ4_NL)
        else:
            add(w, p + "ffn_gate.weight", rnd(FFN, HIDDEN, s=0.1), T.Q4_1)
        add(w, p + "ffn_up.weight", rnd(FFN, HIDDEN, s=0.1), T.Q5_0)
        # K-quants need 256-element rows: the down projection's rows are FFN = 256 long.
        kq, fields = (T.Q6_K, [208]) if l == 0 else (T.Q4_K, [0, 2])
        raw = random_blocks(rng, kq, HIDDEN, FFN, fields)
        w.add_tensor(p + "ffn_down.weight", raw, raw_shape=raw.shape, raw_dtype=kq)
    add(w, "output_norm.weight", 1 + rnd(HIDDEN), T.F32)
    if arch == "qwen2":  # untied LM head; the others tie it to the embedding
        add(w, "output.weight", rnd(n_vocab, HIDDEN, s=0.3), T.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if truth:
        np.savez(path.with_suffix(".truth.npz"), **truth)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    write_model(out / "tiny-llama.gguf", "llama", rng, pre="llama-bpe")
    write_model(out / "tiny-qwen2.gguf", "qwen2", rng, pre="qwen2")
    write_model(out / "tiny-qwen3.gguf", "qwen3", rng, pre="qwen2")
    write_model(out / "bad-quant.gguf", "llama", rng, broken="bad-quant")
    write_model(out / "missing-tensor.gguf", "qwen2", rng, broken="missing-tensor")
    write_model(out / "bad-shape.gguf", "qwen3", rng, broken="bad-shape")
    write_model(out / "spm-tokenizer.gguf", "qwen2", rng, broken="spm-tokenizer")
    w = gguf.GGUFWriter(out / "bad-arch.gguf", arch="falcon")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote tiny GGUF files to {out}")


if __name__ == "__main__":
    main()
