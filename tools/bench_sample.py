#!/usr/bin/env python3
"""transformers `generate` side of `temper bench sample`: a worker driven over stdin/stdout.

Started as `bench_sample.py --model DIR --dtype f32|bf16 [--device cuda] [--impl generate|static-compile]`;
prints {"ready": true, ...} once the model is loaded, then for each JSON line
{"prompts": [[id]], "max_new_tokens": N} on stdin runs one `model.generate` (sampling: temperature 1,
top_p 1, top_k off, EOS ignored via min_new_tokens = N, so every row makes exactly N tokens) and
prints {"seconds": wall time, "new_tokens": rows * N}. A failure is answered with {"error": ...}
(its first line; the traceback goes to stderr) and ends the worker.

--impl generate (the default) is eager `generate` with its default dynamic cache.
--impl static-compile (CUDA only) is transformers' documented fast path: `generate` with
cache_implementation="static" and compile_config=CompileConfig(mode="reduce-overhead",
fullgraph=True), under which `generate` runs the decode steps through `torch.compile` and CUDA
graphs (the prefill stays eager). Compilation and graph capture happen on a shape's first calls, so
the first request of each (rows, prompt length, N) is preceded by one untimed warm-up `generate` of
the same shape, and its reply adds "warmup_seconds".
"""
import argparse
import json
import sys
import time
import traceback

import torch
import transformers
from transformers import AutoModelForCausalLM, CompileConfig


def generate_kwargs(impl: str) -> dict:
    """`generate` arguments besides the prompt and lengths: the sampling, plus the cache and
    compilation for static-compile."""
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0)
    if impl == "static-compile":
        kw["cache_implementation"] = "static"
        kw["compile_config"] = CompileConfig(mode="reduce-overhead", fullgraph=True)
    return kw


def timed_generate(model, ids: torch.Tensor, n: int, kw: dict, impl: str) -> tuple[float, torch.Tensor]:
    """Wall seconds for one `generate` of n new tokens per row, and its output."""
    dev = ids.device
    torch.manual_seed(0)
    # Eager runs under inference_mode as before; the compiled path under no_grad (what `generate`
    # itself uses), since inference_mode and compiled CUDA graphs have known rough edges.
    grad_off = torch.inference_mode() if impl == "generate" else torch.no_grad()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    start = time.perf_counter()
    with grad_off:
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **kw
        )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # generate returns before the GPU is done
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument(
        "--impl",
        choices=["generate", "static-compile"],
        default="generate",
        help="eager generate, or static cache + torch.compile reduce-overhead (CUDA only)",
    )
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    dev = torch.device(a.device)
    if a.impl == "static-compile" and dev.type != "cuda":
        # generate would quietly skip compilation off CUDA: refuse rather than time something else.
        raise ValueError(f"--impl static-compile needs a CUDA device (CUDA graphs), not {a.device}")
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(dev).eval()
    kw = generate_kwargs(a.impl)
    ready = {
        "ready": True,
        "impl": a.impl,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    print(json.dumps(ready), flush=True)
    warmed = set()  # (rows, prompt length, new tokens) already compiled and captured
    for line in sys.stdin:
        req = json.loads(line)
        ids = torch.tensor(req["prompts"], dtype=torch.long, device=dev)
        n = req["max_new_tokens"]
        shape = (ids.shape[0], ids.shape[1], n)
        warmup = None
        if a.impl == "static-compile" and shape not in warmed:
            warmup, _ = timed_generate(model, ids, n, kw, a.impl)
            warmed.add(shape)
        seconds, out = timed_generate(model, ids, n, kw, a.impl)
        new = out.shape[1] - ids.shape[1]
        reply = {"seconds": seconds, "new_tokens": int(ids.shape[0] * new)}
        if warmup is not None:
            reply["warmup_seconds"] = warmup
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # report any failure to the driver (its stderr is discarded), then exit
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(json.dumps({"error": f"{type(e).__name__}: {first}"}), flush=True)
        sys.exit(1)
