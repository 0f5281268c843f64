#!/usr/bin/env python3
"""Reference logprobs for a GGUF model, computed by transformers from the GGUF file itself.

    .venv/bin/python tools/gguf_logprobs.py FILE.gguf CASES.json

CASES.json: a list of {"text": str, "chat": bool, "ids": [int, ...]}. The model and tokenizer come
from `from_pretrained(dir, gguf_file=FILE)` (transformers' own GGUF import, float32). For each case
prints (one JSON list, same order):
- ref_ids: transformers' token ids for `text` (with `chat`, the text as one user message rendered
  by the file's chat template with the generation prompt, tokenized without extra special tokens);
- logp: log p(ids[t+1] | ids[..=t]) for the given `ids`;
- top_next: the 5 likeliest next tokens after the last id, [[id, logp], ...].
Used by crates/temper-cli/tests/smollm2_real.rs to check `temper score`.
"""

import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()


def main() -> None:
    gguf_file = Path(sys.argv[1])
    cases = json.loads(Path(sys.argv[2]).read_text())
    kw = dict(gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, dtype=torch.float32, **kw).eval()
    tok = AutoTokenizer.from_pretrained(gguf_file.parent, **kw)
    out = []
    with torch.no_grad():
        for c in cases:
            if c["chat"]:
                text = tok.apply_chat_template([{"role": "user", "content": c["text"]}], tokenize=False, add_generation_prompt=True)
                ref_ids = tok(text, add_special_tokens=False).input_ids
            else:
                ref_ids = tok(c["text"]).input_ids
            ids = c["ids"]
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            picked = logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
            top = torch.topk(logp[-1], 5)
            out.append({
                "ref_ids": ref_ids,
                "logp": picked.tolist(),
                "top_next": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
            })
    print(json.dumps(out))


if __name__ == "__main__":
    main()
