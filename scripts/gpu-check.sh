#!/usr/bin/env bash
# temper on an NVIDIA GPU, end to end. It cannot run on a CPU-only machine: it says so and fails.
#   scripts/gpu-check.sh
# It runs from the repository (building temper there) or from a bundle made by
# scripts/gpu-bundle.sh on another machine (no Rust or network needed; the machine's PyTorch).
# Each check runs under its own time limit and the script goes on after a failure, so one run
# reports every check; the summary at the end lists them (PASS / FAIL / TIMEOUT / SKIP), and the
# exit status is 0 only when none failed.
#  1. the set-up: GPU, driver, torch and CUDA versions; temper links libtorch_cuda and starts;
#  2. the model: real SmolLM2 where it resolves offline ($TEMPER_CACHE holds its GGUF), otherwise
#     seeded random weights of its shape with its real tokenizer (tools/random_weights.py), said;
#  3. a 1-rank NCCL process group: init, all_reduce, broadcast, all_gather (`temper check-dist`);
#  4. check-logprobs on CUDA, f32 and bf16: sampler vs teacher-forced trainer logprobs, and the
#     trainer's logprobs vs transformers on the same GPU and weights;
#  5. 20 steps of the main job (examples/arith-smollm2.toml) with trainer and sampler on cuda:0;
#  6. decode steps replayed as CUDA graphs against eager steps (f32, the same tokens); bench sample
#     on CUDA, bf16 vs transformers generate (eager, and static cache + torch.compile
#     reduce-overhead), f32 and the SDPA decode attention (temper alone), a Qwen2.5-0.5B-shaped
#     model; bench serve on CUDA at 1-128 clients; a profile of transformers' decode in f32 and
#     bf16 under each attention backend (tools/decode_profile.py);
#  7. bench train on CUDA vs PyTorch eager (f32 and autocast bf16), the benchmark's 25M shape and
#     SmolLM2's shape, then against torch.compile;
#  8. the main job with the sampler thread working ahead on the same GPU (rollout.async_steps 0, 1,
#     and 2 with partial rollouts), and bench train at Qwen2.5-1.5B's shape (8 x 1024 tokens);
#  9. data parallel with NCCL on 2 GPUs vs 1 (needs 2 GPUs; SKIP with one).
# Output: $GPU_CHECK_OUT (default gpu-check/): one .txt per check, summary.txt, the main job's
# run folder. GPU_CHECK_BUDGET_S (default 900) stops starting new checks once spent;
# GPU_CHECK_ONLY="name name ..." runs only those checks (a lease too short for all of them); a
# lease of two 6-minute calls runs the lists of scripts/gpu-lease.sh (sampling on random weights
# first, then logprobs, the main job and the server on the real SmolLM2).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${GPU_CHECK_OUT:-$root/gpu-check}"
budget="${GPU_CHECK_BUDGET_S:-900}"
fail() { echo "gpu-check: FAIL: $*" >&2; exit 1; }

echo "== gpu-check: the CUDA set-up"
command -v nvidia-smi >/dev/null 2>&1 || fail "nvidia-smi not found: this machine has no NVIDIA driver"
ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
(( ngpu >= 1 )) || fail "nvidia-smi lists no GPU"
if [[ -f "$root/bundle-torch-version" ]]; then
  # A bundle from scripts/gpu-bundle.sh: the machine's own PyTorch (the version the bundle was
  # built for) provides libtorch and the reference side.
  py="${TEMPER_PYTHON:-python3}"
  bin="$root/bin/temper"
else
  TEMPER_CUDA=1 scripts/setup-env.sh || fail "scripts/setup-env.sh with TEMPER_CUDA=1"
  py="$root/.venv/bin/python"
  [[ -e .venv/libtorch/lib/libtorch_cuda.so ]] || fail ".venv/libtorch is not the CUDA libtorch (rerun with TEMPER_CUDA=1)"
  cargo build --release -p temper-cli || fail "cargo build --release -p temper-cli"
  bin="$root/target/release/temper"
fi
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || fail "$py's torch does not see CUDA"
rm -rf "$out"; mkdir -p "$out"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  "$py" -c 'import torch, transformers; print(f"torch: {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}), transformers: {transformers.__version__}")'
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  "$bin" --version
} 2>&1 | tee "$out/setup.txt"
"$bin" --version >/dev/null || fail "temper does not start against $py's torch"

start=$SECONDS
declare -a summary=()
# check NAME LIMIT_S CMD...: runs CMD with its output in $out/NAME.txt, records the verdict.
check() {
  local name="$1" limit="$2"; shift 2
  if [[ -n "${GPU_CHECK_ONLY:-}" && " $GPU_CHECK_ONLY " != *" $name "* ]]; then
    return
  fi
  local left=$(( budget - (SECONDS - start) ))
  if (( left < 30 )); then
    summary+=("SKIP     $name (the ${budget} s budget is spent)")
    return
  fi
  (( limit > left )) && limit=$left
  echo; echo "== gpu-check: $name (at most ${limit} s)"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  rc=${PIPESTATUS[0]}
  local verdict=PASS
  if (( rc == 124 || rc == 137 )); then verdict=TIMEOUT; elif (( rc != 0 )); then verdict="FAIL($rc)"; fi
  summary+=("$(printf '%-8s %-28s %4d s' "$verdict" "$name" $((SECONDS - t0)))")
}

# The model: the real SmolLM2 when it resolves without a network, else random weights of its shape.
model="${GPU_CHECK_MODEL:-}"
reward=()
if [[ -z "$model" ]]; then
  cache="${TEMPER_CACHE:-$HOME/.cache/temper}"
  if [[ -f "$cache/models/smollm2/config.json" || -f "$cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" ]]; then
    model=smollm2
    echo "model: the real SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to f32)" | tee -a "$out/setup.txt"
  else
    model="$root/models/smollm2-random"
    "$py" tools/random_weights.py --like "$root/models/smollm2-shape" --out "$model" --seed 0 \
      2>&1 | tee -a "$out/setup.txt"
    [[ -f "$model/model.safetensors" ]] || fail "could not write random weights to $model"
    echo "model: RANDOM weights of SmolLM2-135M's shape (seed 0) with its real tokenizer: the real GGUF (98 MB) does not fit one 64 MiB device carry" | tee -a "$out/setup.txt"
    # A random model never answers arithmetic: every reward would be 0 and every update skipped.
    reward=(reward.name=command 'reward.kwargs.cmd=["'"$py"'","tools/letter_reward.py"]')
    echo "main job reward: tools/letter_reward.py (varies on random text, so every step updates)" | tee -a "$out/setup.txt"
  fi
fi

# The model's folder, for the Python tools (the alias resolves to temper's converted copy).
model_dir="$model"
if [[ "$model" == smollm2 ]]; then
  "$bin" score --model smollm2 --ids 1,2 >/dev/null 2>&1  # converts the GGUF once, if not yet
  model_dir="${TEMPER_CACHE:-$HOME/.cache/temper}/models/smollm2"
fi

check nccl-one-rank 120 "$bin" check-dist --device cuda --mib 256

for dtype in f32 bf16; do
  check "check-logprobs-$dtype" 240 "$bin" check-logprobs --model "$model" --device cuda --dtype "$dtype" \
    --max-tokens 64 -n 4 --vs-transformers --python "$py"
done

check main-job-cuda 420 "$bin" train examples/arith-smollm2.toml "model.path=\"$model\"" \
  trainer.device=cuda 'rollout.device="cuda:0"' trainer.total_training_steps=20 trainer.test_freq=10 \
  trainer.save_freq=20 "trainer.default_local_dir=\"$out\"" trainer.experiment_name=main-job "${reward[@]}"
if [[ -f "$out/main-job/metrics.jsonl" ]]; then
  "$py" - "$out/main-job/metrics.jsonl" <<'EOF' 2>&1 | tee -a "$out/main-job-cuda.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
steady = sorted(steps[5:]) or sorted(steps)
print(f"main job on CUDA: {len(steps)} steps; steady state (steps 6-{len(steps)}) median "
      f"{steady[len(steady) // 2]:.3f} s/step, min {steady[0]:.3f}; first step {steps[0]:.3f} s; "
      f"peak {max(r.get('perf/max_memory_allocated_gb', 0) for r in rows):.2f} GiB allocated")
EOF
fi

# Graph replay against eager decode steps (TEMPER_CUDA_GRAPHS=0), f32: the same tokens, the
# same logprobs. 24 rows through a 16-row batch: buckets of 16, then 8.
graphs_vs_eager() {
  local a=(sample --model "$model" --device cuda --dtype f32 --json -n 8 --max-tokens 96 --seed 3
           --ignore-eos --batch-rows 16 --prompt-ids 1,2,3,4,5,6,7,8 --prompt-ids 9,10,11
           --prompt-ids 12)
  "$bin" "${a[@]}" > "$out/graphs-on.jsonl" || return 1
  TEMPER_CUDA_GRAPHS=0 "$bin" "${a[@]}" > "$out/graphs-off.jsonl" || return 1
  "$py" - "$out/graphs-on.jsonl" "$out/graphs-off.jsonl" <<'PY'
import json, sys
on, off = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(on) == len(off) == 24, (len(on), len(off))
same = sum(a["completion_ids"] == b["completion_ids"] for a, b in zip(on, off))
diff = max(abs(x - y) for a, b in zip(on, off)
           for x, y in zip(a["completion_logprobs"], b["completion_logprobs"]))
print(f"graphs vs eager (f32): {same}/24 samples token-identical, logprob max |diff| {diff:.3g}")
sys.exit(0 if same == 24 and diff <= 1e-4 else 1)
PY
}
export -f graphs_vs_eager; export bin model out py
check graphs-vs-eager-f32 120 bash -c graphs_vs_eager

# temper serve on the GPU under 1 to 128 concurrent clients (OpenAI completions, 128 tokens).
check bench-serve-cuda 180 "$bin" bench serve --model "$model_dir" --device cuda \
  --clients 1,8,32,64,128 --requests-per-client 2

# A Qwen2.5-0.5B-shaped model (its published config, SmolLM2's tokenizer, random weights).
qwen_shape() {
  local dir="$root/models/qwen2.5-0.5b-shape"
  if [[ ! -f "$dir/model.safetensors" ]]; then
    mkdir -p "$dir.like"
    "$py" -c "import json, sys; sys.path.insert(0, 'tools'); from qwen2_5_shape import CONFIG; json.dump(CONFIG, open('$dir.like/config.json', 'w'))" || return 1
    cp "$model_dir"/tokenizer*.json "$dir.like/" || return 1
    "$py" tools/random_weights.py --like "$dir.like" --out "$dir" --seed 0 || return 1
  fi
  "$bin" bench sample --model "$dir" --device cuda --dtype bf16 --batch 1,16,64 --rounds 2 --no-python
}
export -f qwen_shape; export root model_dir
check bench-sample-qwen-shape 180 bash -c qwen_shape

# GRPO steps against TRL's GRPOTrainer on the same GPU at the seeds' shape: Qwen2.5-0.5B's shape,
# 32 prompts x 8 answers, up to 512 new tokens (TRL travels as wheels: scripts/gpu-wheels.sh).
grpo_cuda() {
  local dir="$root/models/qwen2.5-0.5b-shape"
  [[ -f "$dir/model.safetensors" ]] || qwen_shape >/dev/null || return 1
  "$bin" bench grpo --device cuda --model "$dir" --dtype bfloat16 --prompts 32 --n 8 \
    --max-tokens 512 --reward letters --micro 32 --steps 2 --warmup 1 --rounds 1 --python "$py"
}
export -f grpo_cuda
check bench-grpo-cuda 400 bash -c grpo_cuda

# Sampling throughput, 64-token prompts, 128 new tokens, EOS banned: bf16 against transformers'
# eager generate and its static cache + torch.compile(reduce-overhead); f32 and the SDPA decode
# attention, temper alone.
check bench-sample-f32 120 "$bin" bench sample --model "$model" --device cuda --dtype f32 \
  --batch 1,16,64,256 --rounds 2 --no-python
check bench-sample-bf16-alone 120 "$bin" bench sample --model "$model" --device cuda --dtype bf16 \
  --batch 1,16,64,256 --rounds 2 --no-python
check bench-sample-bf16-sdpa 120 env TEMPER_DECODE_ATTENTION=sdpa "$bin" bench sample --model "$model" \
  --device cuda --dtype bf16 --batch 1,16,64,256 --rounds 2 --no-python

check bench-sample-bf16 240 "$bin" bench sample --model "$model" --device cuda --dtype bf16 \
  --batch "${GPU_CHECK_PEER_BATCH:-1,16,64}" --rounds "${GPU_CHECK_ROUNDS:-1}" --python "$py"

# Where transformers' decode spends its time, f32 vs bf16 and per attention backend (bf16
# decoded ~4x slower than f32 on both sides on the first H100 run).
check decode-profile 180 "$py" tools/decode_profile.py --model "$model_dir" --device cuda --batch 1

check bench-train-25m 240 "$bin" bench train --device cuda --steps 10 --warmup 3 --rounds 2 --torch-bf16 \
  --python "$py"
check bench-train-smollm2-shape 300 "$bin" bench train --device cuda --steps 10 --warmup 3 --rounds 2 \
  --torch-bf16 --batch 16 --seq 512 --vocab 49152 --hidden 576 --layers 30 --heads 9 --kv-heads 3 \
  --intermediate 1536 --python "$py"
check bench-train-compile 420 "$bin" bench train --device cuda --steps 10 --warmup 3 --rounds 2 --torch-bf16 \
  --torch-compile --batch 16 --seq 512 --vocab 49152 --hidden 576 --layers 30 --heads 9 --kv-heads 3 \
  --intermediate 1536 --python "$py"

# Issue 51 on one GPU: the main job in process strictly on-policy, with a bound of 1, and with a
# bound of 2 and partial rollouts (the sampler thread on its own copy beside the learner): steps
# per minute of steps 5-12, the lag, and the scores.
for bound in 0 1 2; do
  partial=()
  (( bound == 2 )) && partial=(rollout.partial_rollouts=true)
  check "async-main-job-bound-$bound" 120 "$bin" train examples/arith-smollm2.toml "model.path=\"$model\"" \
    trainer.device=cuda trainer.total_training_steps=12 trainer.test_freq=0 trainer.save_freq=0 \
    "rollout.async_steps=$bound" "${partial[@]}" "trainer.default_local_dir=\"$out\"" \
    "trainer.experiment_name=async-$bound" "${reward[@]}"
done
if [[ -f "$out/async-0/metrics.jsonl" ]]; then
  "$py" - "$out"/async-[012] <<'EOF' 2>&1 | tee -a "$out/async-main-job-bound-2.txt"
import json, os, sys
base = None
for d in sys.argv[1:]:
    if not os.path.exists(d + "/metrics.jsonl"):
        continue
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    steps = sorted(r["timing_s/step"] for r in rows[4:])
    med = steps[len(steps) // 2]
    base = base or med
    lag = max(r.get("rollout/policy_lag_max", 0) for r in rows)
    scores = [round(r.get("critic/score/mean", float("nan")), 3) for r in rows[:4]]
    print(f"{os.path.basename(d)}: median {med:.3f} s/step ({60 / med:.1f} steps/min, {base / med:.2f}x "
          f"the strict run), lag max {lag:.0f}, scores of steps 1-4 {scores}")
EOF
fi

# Issue 50 on one GPU: a full fine-tune step at Qwen2.5-1.5B's shape (its published config: tied
# head), 8 x 1024 tokens, against PyTorch eager and autocast bf16.
check bench-train-qwen1.5b-shape 300 "$bin" bench train --device cuda --steps 3 --warmup 1 --rounds 1 \
  --torch-bf16 --batch 8 --seq 1024 --vocab 151936 --hidden 1536 --layers 28 --heads 12 --kv-heads 2 \
  --intermediate 8960 --python "$py"

if (( ngpu >= 2 )); then
  two_gpus() {
    local common=(examples/arith-smollm2.toml "model.path=\"$model\"" trainer.device=cuda
                  trainer.total_training_steps=3 trainer.test_freq=0 trainer.save_freq=3
                  actor.ppo_micro_batch_size_per_gpu=8 "trainer.default_local_dir=\"$out\"")
    "$bin" train "${common[@]}" trainer.experiment_name=one-gpu || return 1
    TEMPER_DIST_BACKEND=nccl "$bin" train --nproc 2 "${common[@]}" trainer.experiment_name=two-gpus || return 1
    "$py" tools/compare_runs.py "$out/one-gpu" "$out/two-gpus"
  }
  export -f two_gpus; export bin model out py
  check nccl-two-gpus 600 bash -c two_gpus
else
  summary+=("SKIP     nccl-two-gpus                (needs 2 GPUs; nvidia-smi lists $ngpu)")
fi

{
  echo
  echo "== gpu-check summary ($((SECONDS - start)) s)"
  cat "$out/setup.txt"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.txt"
! printf '%s\n' "${summary[@]}" | grep -q '^FAIL\|^TIMEOUT'
