#!/usr/bin/env bash
# `make contract-env` (and its alias `make engine-env`): the separate virtualenv holding the real
# sglang 0.5.23, for tests/contract/ (its parser and models) and tests/engine/ (its server on a
# CPU) and nothing else. One venv for both: the server's imports are a superset of the parser's,
# and a second 2 GB build would cost CI minutes for nothing. Built once per set of pins into a
# cache outside the repo (a fresh CI clone reuses it) and linked as .venv-sglang. Every package
# is pinned in requirements.txt and installed with --no-deps, so pip can never pull sglang's own
# torch/CUDA dependency tree. The stand-in for the CUDA-only sgl_kernel (support/sgl_kernel_cpu)
# is copied into site-packages; it is hashed too.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3.11}
reqs=tests/contract/requirements.txt
standin=support/sgl_kernel_cpu
hash=$(cat "$reqs" "$0" "$standin"/sgl_kernel/__init__.py "$standin"/torchvision_cpu_ops.py \
  "$standin"/torchvision_cpu_ops.pth | sha256sum | cut -c1-16)
cache=${REGEN_CACHE_DIR:-$HOME/.cache/regen}
target=$cache/venv-sglang-$hash
link=.venv-sglang

mkdir -p "$cache"
exec 9>"$cache/venv-sglang.lock"
flock 9  # two clones building at once: the second waits and reuses the first's

if [ ! -f "$target/.complete" ]; then
  start=$(date +%s)
  echo "sglang-env: building $target (about 2.2 GB, about 90 s)"
  rm -rf "$target.tmp"
  "$PYTHON" -m venv "$target.tmp"
  "$target.tmp/bin/python" -m pip install --quiet --no-deps --no-input -r "$reqs"
  site=$("$target.tmp/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp -r "$standin"/sgl_kernel "$standin"/torchvision_cpu_ops.py "$standin"/torchvision_cpu_ops.pth "$site"/
  # A venv records its own path in its scripts; python -m is path-independent, so the rename
  # below is safe for everything the tests run. The smoke imports are the contract's modules and
  # the server's own import tree on the CPU path (sgl_kernel names, torchvision, uvicorn, ...).
  "$target.tmp/bin/python" -c "import sglang.srt.server_args, sglang.srt.entrypoints.openai.protocol"
  SGLANG_USE_CPU_ENGINE=1 "$target.tmp/bin/python" -c "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.models.qwen3"
  mv "$target.tmp" "$target"
  touch "$target/.complete"
  echo "sglang-env: built in $(( $(date +%s) - start )) s"
fi
if [ "$(readlink "$link" 2>/dev/null)" != "$target" ]; then
  rm -rf "$link"
  ln -s "$target" "$link"
fi
echo "sglang-env: $link -> $target"
