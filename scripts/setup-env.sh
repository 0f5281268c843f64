#!/usr/bin/env bash
# Creates the project-local Python venv that provides libtorch (from PyTorch's PyPI wheel) and the
# reference libraries the tests compare against (transformers, gguf). Idempotent and quick when done.
#
#   scripts/setup-env.sh                 # CPU build (also what CI runs)
#   TEMPER_CUDA=1 scripts/setup-env.sh   # link libtorch_cuda too (auto when nvidia-smi sees a GPU)
#
# PyPI's Linux torch wheel is the CUDA one. The Rust build alone would need only libtorch_cpu (+ two small
# CUDA runtime packages), but `import torch` in the reference scripts loads libtorch_cuda and all its
# libraries, so the full wheel is installed (about 1 minute, 5 GB).
#
# Layout it leaves behind (read by .cargo/config.toml):
#   .venv/site      -> site-packages of the venv
#   .venv/libtorch  -> what tch links against: with CUDA the real torch folder; on CPU a folder of
#                      links to torch's include/, libtorch_cpu.so, libc10.so, libgomp and an empty
#                      stand-in libtorch.so, so that libtorch_cuda.so is never linked.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
TORCH_VERSION=2.13.0          # tch 0.26.0 pairs with torch 2.13.0
stamp="$venv/.temper-env"
# Independent reference implementations used by tests, tools/ and benchmarks (trl: `temper bench grpo`),
# and the run loggers trainer.logger starts (tensorboard reads the event files in tests; wandb writes
# offline runs through tools/wandb_sidecar.py).
REFERENCE_PACKAGES=(numpy "transformers==5.23.0" "gguf==0.19.0" safetensors sentencepiece protobuf "trl==1.16.0" "peft==0.21.2" "tinker==0.38.0" "math-verify==0.9.0" "tensorboard==2.21.0" "wandb==0.31.0")
# tinker-cookbook's recipes run against `temper serve` in the tests. Its PyPI metadata requires
# tml-renderers>=0.4.1, which PyPI does not have (0.2.1 at most) and which the recipes tested do not
# import: the cookbook goes in without its dependencies, and these (its other requirements) beside it.
COOKBOOK="tinker-cookbook==0.6.1"
COOKBOOK_DEPS=("aiohttp>=3.9" "anyio>=4" "blobfile>=3" "chz>=0.4.0" "cloudpickle>=3" "datasets>=2.14"
  "pillow>=10" "pyrage>=1.4" "rich>=13" "termcolor>=2" "tiktoken>=0.12" "tqdm>=4.60" "pylatexenc>=2.0"
  "textarena==0.7.4")  # the multiplayer-rl extra (text_arena's tic-tac-toe, docs/tinker.md)
cuda="${TEMPER_CUDA:-}"
if [[ -z "$cuda" ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=1; fi
want="torch=$TORCH_VERSION cuda=${cuda:-0} ${REFERENCE_PACKAGES[*]} $COOKBOOK ${COOKBOOK_DEPS[*]}"

# c10d's Gloo process group (data-parallel training, temper-kernels/csrc/comm.cpp) includes the gloo
# headers, which PyTorch's wheel does not ship: Debian's libgloo-dev provides them (headers only are
# used; the gloo code that runs is libtorch's own). Without them temper builds without c10d.
if [[ ! -f /usr/include/gloo/config.h ]] && command -v apt-get >/dev/null 2>&1; then
  echo "temper: installing the gloo headers (Debian libgloo-dev) for c10d" >&2
  sudo=(); [[ "$(id -u)" -ne 0 ]] && command -v sudo >/dev/null 2>&1 && sudo=(sudo)
  apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends)
  "${apt[@]}" install libgloo-dev >/dev/null 2>&1 \
    || { "${sudo[@]}" apt-get -q update >/dev/null 2>&1 && "${apt[@]}" install libgloo-dev >/dev/null; } \
    || echo "temper: warning: could not install libgloo-dev; building without c10d" >&2
fi

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi

py="${PYTHON:-python3}"
echo "temper: setting up $venv ($want); first time only" >&2
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" "${REFERENCE_PACKAGES[@]}"
"${pip[@]}" "${COOKBOOK_DEPS[@]}"
"${pip[@]}" --no-deps "$COOKBOOK"

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ln -sfn "$site" "$venv/site"
rm -rf "$venv/libtorch"
if [[ -n "$cuda" ]]; then
  # c10d's ProcessGroupNCCL.hpp includes CUDA's crt/host_config.h and (CUDA 13) CCCL's nv/target,
  # which the torch wheel's CUDA dependencies do not ship (nccl.h and the runtime headers they do).
  "$root/scripts/cuda-headers.sh" "$venv" || exit 1
  ln -sfn "$site/torch" "$venv/libtorch"
else
  mkdir -p "$venv/libtorch/lib"
  ln -sfn "$site/torch/include" "$venv/libtorch/include"
  for f in libtorch_cpu.so libc10.so; do ln -sfn "$site/torch/lib/$f" "$venv/libtorch/lib/$f"; done
  for f in "$site"/torch/lib/libgomp*.so*; do ln -sfn "$f" "$venv/libtorch/lib/$(basename "$f")"; done
  gcc -shared -fPIC -o "$venv/libtorch/lib/libtorch.so" -x c /dev/null
fi
echo "$want" > "$stamp"
echo "temper: environment ready" >&2
