#!/usr/bin/env bash
# `make contract-env`: the separate virtualenv holding the real sglang 0.5.23, for the contract
# tests and nothing else. Built once per set of pins into a cache outside the repo (a fresh CI
# clone reuses it) and linked as .venv-sglang. Every package is pinned in requirements.txt and
# installed with --no-deps, so pip can never pull sglang's own torch/CUDA dependency tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3.11}
reqs=tests/contract/requirements.txt
hash=$(cat "$reqs" "$0" | sha256sum | cut -c1-16)
cache=${REGEN_CACHE_DIR:-$HOME/.cache/regen}
target=$cache/venv-sglang-$hash
link=.venv-sglang

mkdir -p "$cache"
exec 9>"$cache/venv-sglang.lock"
flock 9  # two clones building at once: the second waits and reuses the first's

if [ ! -f "$target/.complete" ]; then
  start=$(date +%s)
  echo "contract-env: building $target (about 2 GB, a few minutes)"
  rm -rf "$target.tmp"
  "$PYTHON" -m venv "$target.tmp"
  "$target.tmp/bin/python" -m pip install --quiet --no-deps --no-input -r "$reqs"
  # A venv records its own path in its scripts; python -m is path-independent, so the rename
  # below is safe for everything the tests run.
  "$target.tmp/bin/python" -c "import sglang.srt.server_args, sglang.srt.entrypoints.openai.protocol"
  mv "$target.tmp" "$target"
  touch "$target/.complete"
  echo "contract-env: built in $(( $(date +%s) - start )) s"
fi
if [ "$(readlink "$link" 2>/dev/null)" != "$target" ]; then
  rm -rf "$link"
  ln -s "$target" "$link"
fi
echo "contract-env: $link -> $target"
