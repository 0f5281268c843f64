"""Drives a running `temper serve` through the unmodified tinker SDK (tinker==0.38.0) and checks
every answer against an independent computation.

    TINKER_BASE_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-local TINKER_TELEMETRY=0 \
        .venv/bin/python tools/tinker_sdk_check.py BASE_MODEL_DIR

Checks:
- each of the seven losses (`stable_reinforce` as temper reads it, docs/tinker.md, with a sampler
  that records and datums with provenance): `loss:sum` equals the loss computed here in PyTorch from the logprobs
  the server returns (the formulas of Tinker's docs), and its gradient equals the gradient of that
  PyTorch loss: one model is stepped with the server's loss, an identically initialised one with
  `forward_backward_custom` (the SDK sends cross_entropy with weights -dC/dlogprobs), both with
  Adam's eps large enough that a step is linear in the gradient, and the next logprobs agree;
- forward's logprobs equal compute_logprobs' for the same tokens, and a fresh LoRA model (B = 0)
  scores exactly as the base model;
- optim_step changes the next forward; seeded sampling reproduces; a stop token ends a sample and
  is returned; several samples per prompt;
- save_state / load_state / create_training_client_from_state_with_optimizer restore the weights;
- topk_prompt_logprobs (and prompt_logprobs, prompt_logprobs_last_n) and cross_entropy on (N, K)
  targets against transformers on the same model folder, and the (N, K) gradient against the
  SDK's client-side path;
- get_server_capabilities lists the served model; create_custom_loss runs client-side and equals
  cross_entropy; inflight sampling clients follow the model's latest inflight save while a
  snapshot keeps its weights;
- bad input (unknown loss, `custom`, stable_reinforce without provenance or with provenance whose
  tokens were not sampled or whose sequence is unknown, a datum with a wrong length or token id, an
  unknown checkpoint) is an error naming the datum and field, and the server keeps serving.
Prints one line per check and exits non-zero on the first failure.
"""
import argparse
import json
import sys

import numpy as np
import tinker
import torch
from tinker import types

ap = argparse.ArgumentParser()
ap.add_argument("base_model")
ap.add_argument("--save-to", help="write a saved state's path and its logprobs here (for --resume-from)")
ap.add_argument("--resume-from", help="only check that the state named in this file loads with the same logprobs")
ap.add_argument("--max-model-len", type=int, default=256, help="the server's --max-model-len")
ap.add_argument("--root", help="the server's --root (to find a named LoRA save's merged folder)")
cli = ap.parse_args()
BASE = cli.base_model
RANK = 4


def ok(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok   {what}", flush=True)


def datum(prompt, completion, adv_scale=1.0, with_weights=False):
    full = prompt + completion
    n = len(full) - 1
    inputs = {
        "target_tokens": full[1:],
        "logprobs": [-1.0] * n,  # the sampler's logprobs (q)
        "advantages": [0.0] * (len(prompt) - 1) + [adv_scale * (k + 1) / 3 for k in range(len(completion))],
        # gspo's sequence ratio runs over the completion
        "sequence_ratio_mask": [0.0] * (len(prompt) - 1) + [1.0] * len(completion),
    }
    if with_weights:
        inputs = {"target_tokens": full[1:],
                  "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(completion)}
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)


def arr(x):
    return np.asarray(x.data if hasattr(x, "data") else x, dtype=np.float64)


def torch_loss(name, lp, d, cfg):
    """Tinker's documented loss (a sum over tokens) on logprobs `lp` (a torch tensor)."""
    li = d.loss_fn_inputs
    if name == "cross_entropy":
        return (-lp * torch.tensor(arr(li["weights"]))).sum()
    q = torch.tensor(arr(li["logprobs"]))
    a = torch.tensor(arr(li["advantages"]))
    ratio = torch.exp(lp - q)
    if name == "importance_sampling":
        return -(ratio * a).sum()
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    if name == "ppo":
        return -torch.minimum(ratio * a, torch.clamp(ratio, lo, hi) * a).sum()
    if name == "cispo":
        return -(torch.clamp(ratio, lo, hi).detach() * lp * a).sum()
    if name == "dro":
        beta = cfg.get("beta", 0.05)
        return -(lp * a - 0.5 * beta * (lp - q) ** 2).sum()
    if name == "gspo":
        # The Tinker docs' GSPO-token snippet.
        in_ratio = torch.tensor(arr(li["sequence_ratio_mask"])) != 0
        log_ratio = (lp.detach() - q)[in_ratio].mean()
        ratio = torch.exp(log_ratio + lp - lp.detach())
        return -torch.minimum(ratio * a, torch.clamp(ratio, lo, hi) * a).sum()
    raise ValueError(name)


def stable_loss(lp, recorded, sampled, a, cfg):
    """temper's reading of StableReinforce (docs/tinker.md), over the sampled targets, with the
    logprobs the sampler returned (and recorded)."""
    keep = sampled != 0
    lp, recorded, a = lp[keep], recorded[keep], a[keep]
    r = torch.exp(lp - recorded)
    cap, kl = cfg.get("ratio_cap", 2.0), cfg.get("kl_coeff", 0.0)
    return -(torch.clamp(r, max=cap).detach() * lp * a).sum() + kl * (r - 1 - torch.log(r)).sum()


sc = tinker.ServiceClient()
if cli.resume_from:
    # A server restarted on the same --root: the saved state is still there, and exact.
    saved = json.load(open(cli.resume_from))
    probe = types.Datum(model_input=types.ModelInput.from_ints(saved["tokens"][:-1]),
                        loss_fn_inputs={"target_tokens": saved["tokens"][1:],
                                        "weights": [1.0] * (len(saved["tokens"]) - 1)})
    resumed = sc.create_training_client_from_state_with_optimizer(saved["path"]).result()
    lp = [float(x) for x in resumed.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data]
    ok(lp == saved["logprobs"], f"after a restart, {saved['path']} loads with the same logprobs")
    print("all checks passed")
    sys.exit(0)
tc = sc.create_lora_training_client(base_model=BASE, rank=RANK, seed=11).result()
info = tc.get_info()
ok(info.model_data.model_name == BASE and info.lora_rank == RANK, f"get_info {info.model_id}")
tok = tc.get_tokenizer()
ok(tok.decode(tok.encode("Hi!")) == "Hi!", "get_tokenizer loads offline")

prompt, completion = [72, 105, 33, 10, 50], [43, 50, 61, 52]
rl = datum(prompt, completion)
ce = datum(prompt, completion, with_weights=True)

# A fresh LoRA model scores exactly as the base model.
base_sampler = sc.create_sampling_client(base_model=BASE).result()
full = prompt + completion
base_lp = base_sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
fwd = tc.forward([ce], "cross_entropy").result()
fwd_lp = arr(fwd.loss_fn_outputs[0]["logprobs"])
ok(base_lp[0] is None and np.allclose(fwd_lp, np.array(base_lp[1:], dtype=np.float64), atol=1e-6),
   "forward logprobs == compute_logprobs (B = 0: LoRA model == base model)")

# The served base model samples on the same engine as the OpenAI route: a seeded Tinker sample
# equals the same seeded /v1/completions request, token for token and logprob for logprob.
import os
import urllib.request
tk = base_sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                         sampling_params=types.SamplingParams(max_tokens=6, seed=11)).result()
body = json.dumps({"prompt": prompt, "n": 3, "max_tokens": 6, "seed": 11, "logprobs": 0,
                   "temperature": 1.0}).encode()
req = urllib.request.Request(os.environ["TINKER_BASE_URL"] + "/v1/completions", data=body,
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer " + os.environ["TINKER_API_KEY"]})
oa = json.load(urllib.request.urlopen(req))["choices"]
ok([list(q.tokens) for q in tk.sequences] == [c["token_ids"] for c in oa]
   and all(np.allclose(q.logprobs, c["logprobs"]["token_logprobs"], atol=1e-6) for q, c in zip(tk.sequences, oa)),
   "a base-model Tinker sample == the same seeded OpenAI completion (one serving engine)")

# Loss values against PyTorch, on forward (no gradient).
configs = {"cross_entropy": {}, "importance_sampling": {}, "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
           "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "dro": {"beta": 0.05},
           "gspo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}}
for name, cfg in configs.items():
    d = ce if name == "cross_entropy" else rl
    out = tc.forward([d, d], name, loss_fn_config=cfg or None).result()
    lp = torch.tensor(arr(out.loss_fn_outputs[0]["logprobs"]))
    want = 2 * torch_loss(name, lp, d, cfg).item()
    got = out.metrics["loss:sum"]
    ok(abs(got - want) <= 1e-4 * max(1.0, abs(want)), f"{name}: loss:sum {got:.6f} == torch {want:.6f} (2 datums, summed)")

# Gradients against PyTorch: the server's loss vs the same loss computed here (custom).
adam = types.AdamParams(learning_rate=10.0, beta1=0.0, beta2=0.0, eps=1e3)  # step = -lr * g / (|g| + eps)
probe = datum([72, 105, 33, 10], [43, 50, 61, 52, 10])


def probe_logprobs(client):
    return arr(client.forward([probe], "importance_sampling").result().loss_fn_outputs[0]["logprobs"])


def same_step_as_torch(what, data, loss_fn, cfg, custom, base):
    """Two identically seeded models: one steps with the server's `loss_fn`, the other with the
    same loss computed here (`custom`, through forward_backward_custom); the probe's logprobs
    after the step agree to 1e-3 of how far the step moved them from `base`'s."""
    a = sc.create_lora_training_client(base_model=BASE, rank=RANK, seed=5).result()
    b = sc.create_lora_training_client(base_model=BASE, rank=RANK, seed=5).result()
    a.forward_backward(data, loss_fn, loss_fn_config=cfg or None).result()
    a.optim_step(adam).result()
    b.forward_backward_custom(data, custom).result()
    b.optim_step(adam).result()
    la, lb = probe_logprobs(a), probe_logprobs(b)
    moved = np.abs(la - probe_logprobs(base)).max()
    ok(moved > 2e-5 and np.abs(la - lb).max() <= 1e-3 * moved,
       f"{what}: gradient == torch's (step moved logprobs by {moved:.2e}, server vs torch differ by {np.abs(la - lb).max():.1e})")


for name, cfg in configs.items():
    d = ce if name == "cross_entropy" else rl

    def custom(data, logprobs_list, name=name, cfg=cfg):
        loss = sum(torch_loss(name, lp.double(), dd, cfg) for dd, lp in zip(data, logprobs_list))
        return loss, {}

    same_step_as_torch(name, [d], name, cfg, custom, tc)

# StableReinforce: a sampler that records, datums naming its sequences (tinker-cookbook's rl_loop
# layout), the loss and its gradient against PyTorch with the logprobs the sampler returned. The
# sampler draws at temperature 0.6, so its logprobs differ from the trained model's (ratios away
# from 1: the cap and the KL term matter).
recorder = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
got = recorder.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                      sampling_params=types.SamplingParams(max_tokens=5, seed=7, stop=[], temperature=0.6)).result()
ok(all(q.sequence_id for q in got.sequences) and got.sequences[0].sequence_id != got.sequences[1].sequence_id,
   f"record_stability_info: each sequence has its own sequence_id ({got.sequences[0].sequence_id})")


def stable_datum(seq, advantage):
    toks, n_p = list(seq.tokens), len(prompt)
    d = types.Datum(model_input=types.ModelInput.from_ints(prompt + toks[:-1]),
                    loss_fn_inputs={"target_tokens": prompt[1:] + toks,
                                    "logprobs": [0.0] * (n_p - 1) + list(seq.logprobs),
                                    "advantages": [0.0] * (n_p - 1) + [advantage] * len(toks)})
    sid = seq.sequence_id
    return d.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=n_p),
                     types.SampledProvenanceSpan(sequence_id=sid, length=len(toks) - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=n_p - 1),
                        types.SampledProvenanceSpan(sequence_id=sid, length=len(toks))])


sdata = [stable_datum(got.sequences[0], 0.75), stable_datum(got.sequences[1], -0.5)]
sr_losses = []
for cfg in [{}, {"kl_coeff": 0.1, "ratio_cap": 1.5}]:
    def sr_loss(data, logprobs_list, cfg=cfg):
        total = 0
        for dd, lp in zip(data, logprobs_list):
            li = dd.loss_fn_inputs
            sampled = torch.tensor([0.0] * (len(prompt) - 1) + [1.0] * (len(arr(li["target_tokens"])) - len(prompt) + 1))
            total = total + stable_loss(lp.double(), torch.tensor(arr(li["logprobs"])), sampled,
                                        torch.tensor(arr(li["advantages"])), cfg)
        return total, {}

    out = tc.forward(sdata, "stable_reinforce", loss_fn_config=cfg or None).result()
    lps = [torch.tensor(arr(o["logprobs"])) for o in out.loss_fn_outputs]
    want = sr_loss(sdata, lps)[0].item()
    ok(abs(out.metrics["loss:sum"] - want) <= 1e-4 * max(1.0, abs(want)),
       f"stable_reinforce {cfg}: loss:sum {out.metrics['loss:sum']:.6f} == torch {want:.6f}")
    sr_losses.append(want)
    same_step_as_torch(f"stable_reinforce {cfg}", sdata, "stable_reinforce", cfg, sr_loss, tc)

ok(abs(sr_losses[0] - sr_losses[1]) > 1e-3, f"stable_reinforce: the cap and kl_coeff change the loss ({sr_losses})")

# Top-k prompt logprobs and (N, K) cross_entropy (distillation onto a teacher's top-k) against
# transformers running the same model folder.
from transformers import AutoModelForCausalLM

hf = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.float32)
toks = prompt + completion
with torch.no_grad():
    ref = torch.log_softmax(hf(torch.tensor([toks])).logits[0].double(), -1)  # row i predicts toks[i+1]
K = 5
res = base_sampler.sample(types.ModelInput.from_ints(toks), 1, types.SamplingParams(max_tokens=1),
                          include_prompt_logprobs=True, topk_prompt_logprobs=K).result()
topk = res.topk_prompt_logprobs
best = [sorted(ref[i - 1].tolist(), reverse=True)[:K] for i in range(1, len(toks))]
ok(topk[0] is None and len(topk) == len(toks)
   and all(len(row) == K for row in topk[1:])
   and all(abs(lp - ref[i - 1][tid].item()) < 1e-4 for i, row in enumerate(topk) if row for tid, lp in row)
   and all(np.allclose([lp for _, lp in row], best[i - 1], atol=1e-4) for i, row in enumerate(topk) if row),
   f"topk_prompt_logprobs={K}: the {K} most likely next tokens and their logprobs == transformers'")
ok(np.allclose(res.prompt_logprobs[1:], [ref[i - 1][toks[i]].item() for i in range(1, len(toks))], atol=1e-4),
   "prompt_logprobs beside topk_prompt_logprobs == transformers'")
last = base_sampler.sample(types.ModelInput.from_ints(toks), 1, types.SamplingParams(max_tokens=1),
                           include_prompt_logprobs=True, topk_prompt_logprobs=2, prompt_logprobs_last_n=3).result()
ok(all(x is None for x in last.prompt_logprobs[:-3]) and all(x is not None for x in last.prompt_logprobs[-3:])
   and all(r is None for r in last.topk_prompt_logprobs[:-3]),
   "prompt_logprobs_last_n=3 scores only the last 3 positions")

# target_prompt_logprobs, as tinker-cookbook's decisions recipe sends it (sparse, pad -1) and dense:
# the logprob of the named ids at the named positions, 0.0 elsewhere, in the request's layout.
labels = [toks[3], 17, 42]
tgt = torch.full((len(toks) - 1, len(labels)), -1, dtype=torch.int64)
tgt[2] = torch.tensor(labels)
tgt[len(toks) - 2, 1] = 99
want_t = torch.zeros(tgt.shape, dtype=torch.float64)
for i, j in (tgt >= 0).nonzero().tolist():
    want_t[i, j] = ref[i][tgt[i, j]]
for name, td in (("sparse", types.TensorData.from_torch_sparse(tgt, pad_value=-1)),
                 ("dense", types.TensorData.from_torch(tgt))):
    r = base_sampler.sample(types.ModelInput.from_ints(toks), 1, types.SamplingParams(max_tokens=1),
                            target_prompt_logprobs=td).result()
    got = r.target_prompt_logprobs
    ok(got is not None and list(got.shape) == list(tgt.shape)
       and (got.sparse_crow_indices is not None) == (td.sparse_crow_indices is not None)
       and torch.allclose(got.to_torch().double(), want_t, atol=1e-4),
       f"target_prompt_logprobs ({name}, {int((tgt >= 0).sum())} ids): the named ids' logprobs == transformers', 0 elsewhere")

# topk_sample_logprobs: at every sampled position the top-k of transformers on prompt + sample.
r = base_sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6, seed=3),
                        topk_sample_logprobs=4).result()
good = True
for s in r.sequences:
    full = prompt + s.tokens
    with torch.no_grad():
        lp_full = torch.log_softmax(hf(torch.tensor([full])).logits[0].double(), -1)
    for j, row in enumerate(s.topk_logprobs):
        want = torch.topk(lp_full[len(prompt) - 1 + j], 4)
        good &= len(row) == 4 and [t for t, _ in row] == want.indices.tolist() \
            and np.allclose([lp for _, lp in row], want.values.tolist(), atol=1e-4)
ok(good and all(len(s.topk_logprobs) == len(s.tokens) for s in r.sequences),
   "topk_sample_logprobs=4: each sampled position's top 4 == transformers' on prompt + sample")

# prompt_alt_tokens_k: k draws per prompt position after the first, with the model's logprobs of
# the drawn ids; seeded draws repeat; at T = 0 the most likely token; at T = 1 and T = 0.1 the
# draws follow the (tempered) distribution: the share of most-likely draws against its mean
# probability, within 5 standard errors.
def alt(k, temperature, seed):
    r = base_sampler.sample(types.ModelInput.from_ints(toks), 1,
                            types.SamplingParams(max_tokens=1, temperature=temperature, seed=seed),
                            prompt_alt_tokens_k=k).result()
    return r.prompt_alt_tokens.tokens.to_torch(), r.prompt_alt_tokens.logprobs.to_torch()


a_tok, a_lp = alt(64, 1.0, 11)
rows = torch.arange(len(toks) - 1).unsqueeze(1)
ok(tuple(a_tok.shape) == (len(toks) - 1, 64) and torch.allclose(a_lp.double(), ref[rows, a_tok], atol=1e-4),
   "prompt_alt_tokens_k=64: [len(prompt) - 1, 64] draws with transformers' logprobs of the drawn ids")
ok(torch.equal(alt(64, 1.0, 11)[0], a_tok) and not torch.equal(alt(64, 1.0, 12)[0], a_tok),
   "prompt_alt_tokens_k: the same seed draws the same ids, another seed others")
for temperature in (1.0, 0.1):
    drawn = alt(64, temperature, 5)[0]
    p_max = torch.softmax(ref[: len(toks) - 1] / temperature, -1).max(-1)
    share = (drawn == p_max.indices.unsqueeze(1)).double().mean().item()
    mean_p = p_max.values.mean().item()
    sd = (mean_p * (1 - mean_p) / drawn.numel()) ** 0.5
    ok(abs(share - mean_p) < 5 * sd,
       f"prompt_alt_tokens_k at T = {temperature}: most-likely draws {share:.3f} vs the distribution's mean "
       f"probability {mean_p:.3f} (standard error {sd:.3f})")
ok(torch.equal(alt(3, 0.0, 1)[0], p_max.indices.unsqueeze(1).repeat(1, 3)),
   "prompt_alt_tokens_k at T = 0: the most likely token every time")

# (N, K) targets: each position's top-K teacher tokens with weights (zero on the prompt), sent as
# torch tensors (the SDK sends them sparse when that is smaller).
n_in = len(toks) - 1
tgt_nk = torch.tensor([[tid for tid, _ in (topk[i + 1] or [(0, 0.0)] * K)] for i in range(n_in)], dtype=torch.long)
w_nk = torch.tensor([[0.0] * K if i < len(prompt) - 1 else [float(np.exp(lp)) for _, lp in topk[i + 1]]
                     for i in range(n_in)], dtype=torch.float32)
nk = types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                 loss_fn_inputs={"target_tokens": tgt_nk, "weights": w_nk})
fresh = sc.create_lora_training_client(base_model=BASE, rank=RANK, seed=5).result()
out_nk = fresh.forward([nk], "cross_entropy").result()
lp_nk = out_nk.loss_fn_outputs[0]["logprobs"].to_torch()
want_lp = torch.stack([ref[i][tgt_nk[i]] for i in range(n_in)])
want_loss = -(want_lp * w_nk.double()).sum().item()
ok(tuple(lp_nk.shape) == (n_in, K) and torch.allclose(lp_nk.double(), want_lp, atol=1e-4)
   and abs(out_nk.metrics["loss:sum"] - want_loss) <= 1e-4 * max(1.0, abs(want_loss)),
   f"cross_entropy on ({n_in}, {K}) targets: logprobs and loss:sum {out_nk.metrics['loss:sum']:.5f} == transformers' {want_loss:.5f}")
same_step_as_torch("cross_entropy (N, K)", [nk], "cross_entropy", {},
                   lambda data, lps: (sum(-(lp.double() * dd.loss_fn_inputs["weights"].to_torch().double()).sum()
                                          for dd, lp in zip(data, lps)), {}),
                   fresh)

# get_server_capabilities: exactly the served model, trainable and sampleable.
caps = tinker.RestClient().get_server_capabilities().result()
ok(len(caps.supported_models) == 1 and caps.supported_models[0].trainable
   and caps.supported_models[0].max_context_length == cli.max_model_len,
   f"get_server_capabilities lists the served model ({caps.supported_models[0].model_name})")

# create_custom_loss (the SDK traces it and, as temper's client config says, runs it client-side
# through forward_backward_custom): its loss equals the built-in cross_entropy's.
def neg_ll(logprobs, weights):
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss}


handle = sc.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result()
c = sc.create_lora_training_client(base_model=BASE, rank=RANK, seed=5).result()
builtin = c.forward([ce], "cross_entropy").result().metrics["loss:sum"]
custom_out = c.forward_backward_custom([ce], handle).result()
ok(abs(custom_out.metrics["custom/neg_ll:sum"] - builtin) <= 1e-4 * max(1.0, abs(builtin)),
   f"create_custom_loss + forward_backward_custom: {custom_out.metrics['custom/neg_ll:sum']:.6f} == cross_entropy {builtin:.6f}")

# Inflight sampling clients: every inflight client of a model samples its latest inflight save
# (the SDK's SamplingClientKind contract); a snapshot keeps its weights.
seq = types.ModelInput.from_ints(prompt + completion)
inf_a = c.save_weights_and_get_sampling_client(kind="inflight").result()
snap_before = c.save_weights_and_get_sampling_client().result()
lp_a0 = inf_a.compute_logprobs(seq).result()[1:]
c.forward_backward([ce], "cross_entropy").result()
c.optim_step(types.AdamParams(learning_rate=0.05)).result()
inf_b = c.save_weights_and_get_sampling_client(kind="inflight").result()
lp_a1, lp_b = inf_a.compute_logprobs(seq).result()[1:], inf_b.compute_logprobs(seq).result()[1:]
lp_snap = snap_before.compute_logprobs(seq).result()[1:]
trained = arr(c.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"])
ok(np.allclose(lp_a1, lp_b, atol=1e-6) and np.allclose(lp_b, trained, atol=1e-5)
   and np.abs(np.array(lp_a1) - np.array(lp_a0)).max() > 1e-4 and np.allclose(lp_snap, lp_a0, atol=1e-6),
   "an inflight client samples the model's latest inflight save; a snapshot keeps its weights")

# Gradients accumulate across forward_backward calls; optim_step changes the next forward.
before = arr(tc.forward([rl], "importance_sampling").result().loss_fn_outputs[0]["logprobs"])
tc.forward_backward([rl], "importance_sampling").result()
tc.forward_backward([rl], "importance_sampling").result()
step = tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
after = arr(tc.forward([rl], "importance_sampling").result().loss_fn_outputs[0]["logprobs"])
ok(np.abs(after - before).max() > 1e-4, f"optim_step changes the next forward (metrics {step.metrics})")

# Sampling: a snapshot, seeded, several samples, a stop token kept.
sampler = tc.save_weights_and_get_sampling_client().result()
params = types.SamplingParams(max_tokens=6, seed=3, temperature=1.0)
r1 = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
r2 = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
ok(len(r1.sequences) == 3 and [s.tokens for s in r1.sequences] == [s.tokens for s in r2.sequences],
   "seeded sampling reproduces, 3 samples")
ok(all(len(s.logprobs) == len(s.tokens) and s.stop_reason in ("stop", "length") for s in r1.sequences),
   "one logprob per token, a stop reason")
stop_at = r1.sequences[0].tokens[1]
r3 = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=1,
                    sampling_params=types.SamplingParams(max_tokens=6, seed=3, stop=[stop_at])).result()
s = r3.sequences[0]
ok(s.stop_reason == "stop" and s.tokens[-1] == stop_at and stop_at not in s.tokens[:-1],
   f"a stop token ends the sample and is returned ({s.tokens})")
# The sampled tokens' logprobs are the training model's (the snapshot was taken now).
seq = r1.sequences[0]
scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + seq.tokens)).result()
ok(np.allclose(np.array(scored[len(prompt):]), np.array(seq.logprobs), atol=1e-5),
   "sampled logprobs == compute_logprobs of the sampled tokens")
# max_tokens=None samples to the end of the context; stop=[] turns EOS off too (the SDK's
# SamplingParams docstring), so the sample is exactly the rest of the context.
full = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=1,
                      sampling_params=types.SamplingParams(max_tokens=None, stop=[], seed=5)).result()
s = full.sequences[0]
ok(len(s.tokens) == cli.max_model_len - len(prompt) and s.stop_reason == "length",
   f"max_tokens=None, stop=[]: {len(s.tokens)} tokens = the rest of the {cli.max_model_len}-token context")
# At temperature T the sampled tokens' logprobs are log_softmax(logits / T) (what the Tinker
# maintainers state for the hosted service, tinker-cookbook PR #86): two samples that differ at
# their first token satisfy lp_T(a) - lp_T(b) = (lp_1(a) - lp_1(b)) / T, with lp_1 from
# compute_logprobs (temperature 1).
T = 0.5
hot = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=16,
                     sampling_params=types.SamplingParams(max_tokens=1, seed=9, temperature=T)).result()
firsts = {}
for q in hot.sequences:
    firsts.setdefault(q.tokens[0], q.logprobs[0])
(a, lpa), (b, lpb) = list(firsts.items())[:2]
lp1 = [sampler.compute_logprobs(types.ModelInput.from_ints(prompt + [t])).result()[-1] for t in (a, b)]
# 5e-4: the two sides sum a real vocabulary (49k for SmolLM2) in f32 in different batch shapes;
# without the scaling they differ by (1/T - 1) times the gap, here ~0.1.
ok(abs((lpa - lpb) - (lp1[0] - lp1[1]) / T) < 5e-4,
   f"logprobs at T={T} are temperature-scaled: {lpa - lpb:.5f} vs {(lp1[0] - lp1[1]) / T:.5f}")
# The snapshot keeps its weights while training goes on.
tc.forward_backward([rl], "importance_sampling").result()
tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
r4 = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
ok([x.tokens for x in r4.sequences] == [x.tokens for x in r1.sequences], "a sampling client keeps its snapshot")

# State: save, change, load (weights only, then with the optimizer), and a new client from it.
saved_lp = arr(tc.forward([rl], "importance_sampling").result().loss_fn_outputs[0]["logprobs"])
st = tc.save_state("ckpt1").result()
ok(st.path == f"tinker://{tc.model_id}/weights/ckpt1", f"save_state -> {st.path}")
tc.forward_backward([rl], "importance_sampling").result()
tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
tc.load_state(st.path).result()
back = arr(tc.forward([rl], "importance_sampling").result().loss_fn_outputs[0]["logprobs"])
ok(np.array_equal(back, saved_lp), "load_state restores the weights")
tc.load_state_with_optimizer(st.path).result()
tc2 = sc.create_training_client_from_state_with_optimizer(st.path).result()
again = arr(tc2.forward([rl], "importance_sampling").result().loss_fn_outputs[0]["logprobs"])
ok(np.array_equal(again, saved_lp), f"create_training_client_from_state_with_optimizer -> {tc2.model_id}")
sw = tc.save_weights_for_sampler("s1").result()
named = tc.create_sampling_client(sw.path).result()
ok(named.get_base_model() == BASE, f"save_weights_for_sampler -> {sw.path}")
if cli.root:
    # The LoRA snapshot samples on the served model's one copy with its adapters attached; the
    # same weights merged and saved as a plain HF folder, sampled as a base model (loaded whole),
    # give the same tokens and logprobs.
    import os
    merged = os.path.join(cli.root, tc.model_id, "sampler_weights", "s1", "merged")
    whole = sc.create_sampling_client(base_model=merged)
    p = types.SamplingParams(max_tokens=8, seed=21, temperature=1.0)
    a = named.sample(types.ModelInput.from_ints(prompt), num_samples=4, sampling_params=p).result()
    b = whole.sample(types.ModelInput.from_ints(prompt), num_samples=4, sampling_params=p).result()
    gap = max(abs(x - y) for s, t in zip(a.sequences, b.sequences) for x, y in zip(s.logprobs, t.logprobs))
    ok([s.tokens for s in a.sequences] == [s.tokens for s in b.sequences] and gap < 1e-5,
       f"a LoRA snapshot (adapters on the served copy) samples as its merged folder loaded whole (max gap {gap:.1e})")

# Bad input: a user error naming what is wrong; the server keeps serving.
def fails(fn, needle, what):
    try:
        fn()
    except Exception as e:  # RequestFailedError, ValueError
        ok(needle in str(e), f"{what}: {str(e)[:150]}")
        return
    ok(False, f"{what}: no error")


fails(lambda: tc.forward_backward([rl], "stable_reinforce").result(), "needs provenance",
      "stable_reinforce without provenance")
tampered = sdata[0]
tampered = types.Datum(model_input=tampered.model_input,
                       loss_fn_inputs={**tampered.loss_fn_inputs,
                                       "target_tokens": [7] + list(arr(tampered.loss_fn_inputs["target_tokens"]).astype(int))[1:]},
                       model_input_spans=tampered.model_input_spans, loss_fn_input_spans=tampered.loss_fn_input_spans)
fails(lambda: tc.forward_backward([sdata[1], tampered], "stable_reinforce").result(),
      "datum 1: loss_fn_input_spans[0]: position 0 holds token 7", "provenance whose tokens were not sampled")
import dataclasses
ghost = dataclasses.replace(sdata[0], loss_fn_input_spans=[dataclasses.replace(sp, sequence_id="nope") for sp in sdata[0].loss_fn_input_spans])
fails(lambda: tc.forward_backward([ghost], "stable_reinforce").result(), '"nope" is not recorded', "an unknown sequence_id")
fails(lambda: tc.forward_backward([rl], "custom").result(), "forward_backward_custom", "loss_fn custom")
fails(lambda: tc.forward_backward([rl], "bogus").result(), "bogus", "an unknown loss")
short = types.Datum(model_input=rl.model_input,
                    loss_fn_inputs={**rl.loss_fn_inputs, "advantages": [1.0, 2.0]})
fails(lambda: tc.forward_backward([rl, short], "importance_sampling").result(),
      "datum 1: loss_fn_inputs.advantages has 2 values", "a loss input of the wrong length")
oov = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 99999]), loss_fn_inputs=ce.loss_fn_inputs)
fails(lambda: tc.forward([ce, oov], "cross_entropy").result(), "datum 1: model_input[2] = 99999", "a token id outside the vocabulary")
fails(lambda: tc.load_state(f"tinker://{tc.model_id}/weights/nope").result(), "no such checkpoint", "an unknown checkpoint")
ok(tc.forward([ce], "cross_entropy").result().metrics["loss:sum"] > 0, "still serving")

if cli.save_to:
    final = tc.save_state("final").result()
    tokens = prompt + completion
    probe = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    lp = [float(x) for x in tc.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data]
    json.dump({"path": final.path, "tokens": tokens, "logprobs": lp}, open(cli.save_to, "w"))

sc.close("success") if hasattr(sc, "close") else None
print("all checks passed")
