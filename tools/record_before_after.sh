#!/usr/bin/env bash
# The before/after recordings of a refactor that must change no behaviour (issues 25 and 44,
# BENCHMARKS.md): with one build's `temper` binary and its checkout, writes into OUT the main job's
# run (3 steps), the debate example's run (2 steps), the tinker SDK's numbers against `temper serve`
# and temper's side of `bench grpo`, all in f32. Run it once per build, then compare:
#   python tools/compare_rollouts.py OUT_A/main OUT_B/main      (and OUT_*/debate; cmp the records)
#   python tools/tinker_sdk_numbers.py --compare OUT_A/sdk.json OUT_B/sdk.json
# Usage: tools/record_before_after.sh OUT TEMPER_BINARY CHECKOUT
# The runs keep their checkpoints (about 3 GB for both): delete OUT/*/checkpoints when done.
set -u
out=$1; bin=$2; tree=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$here/.venv/bin/python"
rm -rf "$out"; mkdir -p "$out"
cd "$tree"
uptime > "$out/load.txt"
timeout 3600 "$bin" train examples/arith-smollm2.toml trainer.total_training_steps=3 model.dtype=float32 \
  trainer.experiment_name=main trainer.default_local_dir="$out" > "$out/main.log" 2>&1
timeout 7200 "$bin" train examples/debate-rs-grpo-summary.toml trainer.total_training_steps=2 model.dtype=float32 \
  trainer.experiment_name=debate trainer.default_local_dir="$out" > "$out/debate.log" 2>&1
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --model smollm2 --dtype float32 --port "$port" > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break; sleep 1; done
TINKER_BASE_URL="http://127.0.0.1:$port" TINKER_API_KEY=tml-local timeout 1800 \
  "$py" "$here/tools/tinker_sdk_numbers.py" smollm2 > "$out/sdk.json" 2> "$out/sdk.err"
kill $server; wait $server 2>/dev/null
uptime >> "$out/load.txt"
timeout 1800 "$bin" bench grpo --no-python --steps 3 --warmup 1 --rounds 1 > "$out/bench.log" 2>&1
uptime >> "$out/load.txt"
