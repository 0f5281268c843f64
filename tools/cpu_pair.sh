#!/usr/bin/env bash
# The CPU pair of a speed change (BENCHMARKS.md): two release builds' `temper` binaries run the
# README's main job for 4 steps without evaluation, 5 runs each, alternated ABBA; each run's
# metrics.jsonl stays in OUT (checkpoints deleted), and the load average before every run in
# OUT/load.txt. Compare the medians of timing_s/step, timing_s/update and timing_s/gen of steps 2-4.
# Usage: tools/cpu_pair.sh OUT BEFORE_BINARY AFTER_BINARY   (from the repository root)
set -u
out=$1; before=$2; after=$3
rm -rf "$out"; mkdir -p "$out"
run() {
  local side=$1 bin=$2 i=$3
  uptime >> "$out/load.txt"
  timeout 1800 "$bin" train examples/arith-smollm2.toml trainer.total_training_steps=4 trainer.test_freq=0 \
    trainer.save_freq=0 trainer.experiment_name="pair-$side-$i" trainer.default_local_dir="$out" \
    > "$out/$side-$i.log" 2>&1
  rm -rf "$out/pair-$side-$i/checkpoints"
}
for i in 1 2 3 4 5; do
  if (( i % 2 )); then run before "$before" $i; run after "$after" $i
  else run after "$after" $i; run before "$before" $i; fi
done
uptime >> "$out/load.txt"
