#!/usr/bin/env bash
# `make trainers-env`: the separate virtualenv holding the released SpecForge 0.2.0 and
# speculators 0.9.0, for tests/trainers/ and nothing else: the trainers' own data code judges
# regen's exports. Built once per set of pins into a cache outside the repo (a fresh CI clone
# reuses it) and linked as .venv-trainers. Every package is pinned in requirements.txt and
# installed with --no-deps, so pip can never pull their CUDA torch, sglang or flash-attn.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3.11}
reqs=tests/trainers/requirements.txt
hash=$(cat "$reqs" "$0" | sha256sum | cut -c1-16)
cache=${REGEN_CACHE_DIR:-$HOME/.cache/regen}
target=$cache/venv-trainers-$hash
link=.venv-trainers

mkdir -p "$cache"
exec 9>"$cache/venv-trainers.lock"
flock 9  # two clones building at once: the second waits and reuses the first's

if [ ! -f "$target/.complete" ]; then
  start=$(date +%s)
  echo "trainers-env: building $target (about 1.5 GB, a few minutes)"
  rm -rf "$target.tmp"
  "$PYTHON" -m venv "$target.tmp"
  "$target.tmp/bin/python" -m pip install --quiet --no-deps --no-input -r "$reqs"
  # The driver's imports, checked before the env is published. python -m is path-independent,
  # so the rename below is safe for everything the tests run.
  "$target.tmp/bin/python" -c "import specforge.data.preprocessing, speculators.train.data, \
speculators.train.vocab_mapping, speculators.data_generation.preprocessing"
  mv "$target.tmp" "$target"
  touch "$target/.complete"
  echo "trainers-env: built in $(( $(date +%s) - start )) s"
fi
if [ "$(readlink "$link" 2>/dev/null)" != "$target" ]; then
  rm -rf "$link"
  ln -s "$target" "$link"
fi
echo "trainers-env: $link -> $target"
