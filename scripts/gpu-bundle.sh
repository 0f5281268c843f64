#!/usr/bin/env bash
# A GPU bundle: a release `temper` linked against the libtorch of a given PyTorch version (CUDA,
# with c10d's NCCL), packed with what scripts/gpu-check.sh needs, for a GPU machine that already
# has that PyTorch and has no Rust and no network. The bundle uses that machine's torch libraries
# at run time; nothing of libtorch is packed.
#   scripts/gpu-bundle.sh [TORCH_VERSION]    # default 2.11.0 (an image with torch 2.11.0+cu130)
# Output: target/gpu-bundle-<version>.tar.gz (checked to be at most 64 MiB) and, unpacked beside
# it, target/gpu-bundle-<version>/. On the GPU machine: tar xzf ...; cd gpu-bundle-<version>;
# scripts/gpu-check.sh (it finds bin/temper and the machine's python3 with torch).
#
# tch pairs each release with one libtorch: 0.26 with 2.13 (the default build), 0.25 with 2.12,
# 0.24 with 2.11, 0.23 with 2.10 (torch-sys's TORCH_VERSION). The bundle is built from a copy of
# the tree with tch pinned to the pairing release, against that torch wheel installed (once) in
# .cache/torch-<version>/, in its own target folder: the default build is untouched.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail() { echo "gpu-bundle: FAIL: $*" >&2; exit 1; }
ver="${1:-2.11.0}"
case "$ver" in
  2.13.0) tch=0.26.0 ;;
  2.12.0) tch=0.25.0 ;;
  2.11.0) tch=0.24.0 ;;
  2.10.0) tch=0.23.0 ;;
  *) fail "no tch release is known to pair with torch $ver (known: 2.10.0 to 2.13.0)" ;;
esac

# 1. That torch (PyPI's Linux wheel is the CUDA one) and the CUDA headers NCCL's header needs.
venv="$root/.cache/torch-$ver"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$ver')" 2>/dev/null; then
  echo "gpu-bundle: installing torch==$ver in $venv (once; about 2 minutes)" >&2
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$ver" \
    || fail "pip could not install torch==$ver"
fi
scripts/cuda-headers.sh "$venv" || fail "the CUDA headers for NCCL"
torch="$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
[[ -e "$torch/lib/libtorch_cuda.so" ]] || fail "$torch has no libtorch_cuda.so"

# 2. The tree with tch pinned to the pairing release, built in target/gpu-<version>.
src="$root/target/gpu-src-$ver"
rm -rf "$src"; mkdir -p "$src"
# -m: the copies get the time of copying, so cargo rebuilds whatever changed since the last bundle
# (kept source times can be older than that build and hide an edit).
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xmf - -C "$src"
sed -i "s/^tch = \"=[0-9.]*\"/tch = \"=$tch\"/" "$src/Cargo.toml"
(cd "$src" && cargo update --quiet -p tch --precise "$tch") || fail "cargo could not pin tch $tch"
log="$root/target/gpu-bundle-$ver.log"
LIBTORCH="$torch" CARGO_TARGET_DIR="$root/target/gpu-$ver" \
  cargo build --release -p temper-cli --manifest-path "$src/Cargo.toml" >"$log" 2>&1 \
  || { tail -30 "$log" >&2; fail "the build against torch $ver (log: $log)"; }
grep -q "built without NCCL\|built without c10d" "$log" && fail "$(grep -m1 'built without' "$log")"
bin="$root/target/gpu-$ver/release/temper"

# 3. The bundle: the stripped binary, a launcher that finds the machine's torch, the scripts,
# reference tools and example configs gpu-check.sh uses.
out="$root/target/gpu-bundle-$ver"
rm -rf "$out"; mkdir -p "$out/bin"
strip -o "$out/bin/temper.bin" "$bin"
cat > "$out/bin/temper" <<'EOF'
#!/usr/bin/env bash
# temper from a GPU bundle: runs against the libtorch of the machine's PyTorch (TEMPER_PYTHON, else
# python3), which must be the version the bundle was built for (bundle-torch-version).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${TEMPER_PYTHON:-python3}"
want="$(cat "$here/../bundle-torch-version")"
lib="$("$py" -W ignore -c "import os, torch; v = torch.__version__.split('+')[0]; assert v == '$want', f'this bundle needs torch $want, {v} is installed'; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")" \
  || { echo "temper: $py has no torch $want (set TEMPER_PYTHON to a Python that has it)" >&2; exit 1; }
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEMPER_ROOT="${TEMPER_ROOT:-$here/..}"
exec "$here/temper.bin" "$@"
EOF
chmod +x "$out/bin/temper"
echo "$ver" > "$out/bundle-torch-version"
mkdir -p "$out/scripts" "$out/tools" "$out/examples"
cp scripts/gpu-check.sh "$out/scripts/"
cp tools/*.py "$out/tools/"
cp examples/*.toml "$out/examples/"
# SmolLM2's architecture and tokenizer without its weights (its 98 MB GGUF does not fit a 64 MiB
# device carry): gpu-check.sh gives it seeded random weights there (tools/random_weights.py).
TEMPER_PYTHON="$venv/bin/python" "$out/bin/temper" score --model smollm2 --ids 1,2 >/dev/null \
  || fail "could not resolve the smollm2 model here (its config and tokenizer go in the bundle)"
smol="${TEMPER_CACHE:-$HOME/.cache/temper}/models/smollm2"
mkdir -p "$out/models/smollm2-shape"
for f in config.json tokenizer.json tokenizer_config.json generation_config.json special_tokens_map.json; do
  if [[ -f "$smol/$f" ]]; then cp "$smol/$f" "$out/models/smollm2-shape/"; fi
done
[[ -f "$out/models/smollm2-shape/config.json" && -f "$out/models/smollm2-shape/tokenizer.json" ]] \
  || fail "$smol has no config.json or tokenizer.json"
tar -czf "$out.tar.gz" -C "$root/target" "gpu-bundle-$ver"
size=$(stat -c %s "$out.tar.gz")
(( size <= 64 * 1024 * 1024 )) || fail "$out.tar.gz is $((size / 1048576)) MiB, over the 64 MiB a device call carries"
echo "gpu-bundle: $out.tar.gz ($((size / 1048576)) MiB), temper built against torch $ver"
