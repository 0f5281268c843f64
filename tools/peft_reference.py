#!/usr/bin/env python3
"""Independent LoRA numbers for temper-model's tests: transformers + peft load what temper saved.

Given a base HF folder, a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)
and a merged HF folder, prints JSON {"peft": [[...]], "peft_disabled": [[...]], "merged": [[...]]}:
per row of --ids, the per-token log p(ids[t+1] | ids[..=t]) (float32) of the base model with the
adapter applied by peft, of the same model inside peft's `disable_adapter()` (how TRL scores a LoRA
run's reference policy), and of the merged folder loaded by transformers alone.

Usage: .venv/bin/python tools/peft_reference.py BASE ADAPTER MERGED '[[1,2,3],[4,5]]'
"""
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def logprobs(model, rows):
    out = []
    with torch.no_grad():
        for ids in rows:
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits.float()[0, :-1]
            lp = torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0]
            out.append(lp.tolist())
    return out


def main():
    base_dir, adapter_dir, merged_dir, ids = sys.argv[1:5]
    rows = json.loads(ids)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, adapter_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with peft_model.disable_adapter():
        disabled = logprobs(peft_model, rows)
    print(json.dumps({"peft": logprobs(peft_model, rows), "peft_disabled": disabled,
                      "merged": logprobs(merged, rows)}))


if __name__ == "__main__":
    main()
