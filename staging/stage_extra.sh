#!/usr/bin/env bash
# On the GPU host, from the repository root: unpack the extra piece that
# staging/build_torch_stack.sh builds beside the stack's stream (.extra213/tilelang.tar.xz:
# TileLang and z3-solver) into $SITE (default /tmp/site213 from .extra213/, /tmp/site214 from
# .extra214/), after checking its sha256 against the SHA256SUMS beside it.
#   bash .extra213/stage_extra.sh .extra213/tilelang.tar.xz
# Any call will do, before or after the stream's pieces (no file of it is in the stream), while
# the host stays warm. Idempotent: a piece already unpacked ($SITE/.staged-extra-NAME) is skipped.
# Uses xz when the host has it, else python's lzma (no extra wheel needed).
set -eo pipefail
for p in "$@"; do
  dir=$(cd "$(dirname "$p")" && pwd)
  n=$(basename "$p")
  tag=$(basename "$dir" | sed -n 's/^\.extra\([0-9]*\)$/\1/p')   # .extra213 -> 213 (torch 2.13)
  site=${SITE:-/tmp/site${tag:-213}}
  mark="$site/.staged-extra-${n%%.*}"
  if [ -f "$mark" ]; then echo "$n already unpacked in $site"; continue; fi
  (cd "$dir" && grep " $n\$" SHA256SUMS | sha256sum -c --quiet -) ||
    { echo "ERROR: $p does not match $dir/SHA256SUMS" >&2; exit 1; }
  mkdir -p "$site"
  t0=$(date +%s%N)
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$p" | tar -x -C "$site"
  else
    python3 -c 'import sys, tarfile
tarfile.open(sys.argv[1], mode="r:xz").extractall(sys.argv[2], filter="tar")' "$p" "$site"
  fi
  touch "$mark"
  echo "unpacked $n ($(stat -c %s "$p") bytes) into $site in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
