#!/usr/bin/env bash
# On the GPU host, from the repository root: keep the carried pieces of the stack that
# staging/build_torch_stack.sh built, and once every piece is there, check the whole stream and
# extract it into $SITE (default /tmp/site213 from .stage213/, /tmp/site214 from .stage214/),
# then link the host's own nvidia/* packages (CUDA 13.0 libraries, cuDNN, cusparselt, nvshmem)
# beside the carried nccl in $SITE/nvidia, so torch's RPATH ($ORIGIN/../../nvidia/<pkg>/lib) resolves as in a pip install.
#   bash .stage213/stage_stack.sh .stage213/piece03 [.stage213/piece04 ...]
# One call per piece or two, back to back (the host keeps /tmp only ~30 s after a call). A piece
# whose sha256 is not the one SHA256SUMS gives is refused; a stream that does not check leaves
# $SITE without its mark (.staged-stack) and the pieces removed, so the calls can be made again.
set -eo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
TAG=$(basename "$DIR" | sed -n 's/^\.stage\([0-9]*\)$/\1/p')   # .stage213 -> 213 (torch 2.13)
SITE=${SITE:-/tmp/site${TAG:-213}}
HOLD=${HOLD:-/tmp/stage${TAG:-213}-pieces}
mkdir -p "$SITE" "$HOLD"
if [ -f "$SITE/.staged-stack" ]; then echo "stack already staged in $SITE"; exit 0; fi
for p in "$@"; do
  n=$(basename "$p")
  (cd "$(dirname "$p")" && grep " $n\$" "$DIR/SHA256SUMS" | sha256sum -c --quiet -)
  cp "$p" "$HOLD/$n.tmp" && mv "$HOLD/$n.tmp" "$HOLD/$n"
  echo "kept $n ($(stat -c %s "$p") bytes)"
done
want=$(grep -c ' piece[0-9][0-9]$' "$DIR/SHA256SUMS")
have=$(ls "$HOLD" | grep -c '^piece[0-9][0-9]$' || true)
echo "pieces held: $have of $want"
[ "$have" -eq "$want" ] || exit 0
t0=$(date +%s%N)
sum=$(grep ' stack.tar.zst$' "$DIR/SHA256SUMS" | cut -d' ' -f1)
got=$(cat "$HOLD"/piece?? | sha256sum | cut -d' ' -f1)
if [ "$got" != "$sum" ]; then
  rm -rf "$HOLD"; echo "ERROR: the joined stream's sha256 is $got, expected $sum: stage every piece again" >&2
  exit 1
fi
if command -v zstd >/dev/null 2>&1; then
  cat "$HOLD"/piece?? | zstd -dc --long=27 | tar -x -C "$SITE"
else  # python's zstandard, from a wheel carried in .whl213/ (staging/build_torch_stack.sh)
  python3 -c 'import zstandard' 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --target /tmp/wcp-zstd .whl213/zstandard-*.whl
  cat "$HOLD"/piece?? | PYTHONPATH=/tmp/wcp-zstd python3 -c 'import sys, tarfile, zstandard
r = zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(sys.stdin.buffer)
tarfile.open(fileobj=r, mode="r|").extractall(sys.argv[1], filter="tar")' "$SITE"
fi
host_site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
if [ -n "$host_site" ] && [ -d "$host_site/nvidia" ]; then
  for d in "$host_site"/nvidia/*/; do
    b=$(basename "$d")
    [ -e "$SITE/nvidia/$b" ] || ln -s "${d%/}" "$SITE/nvidia/$b"
  done
fi
rm -rf "$HOLD"
touch "$SITE/.staged-stack"
echo "stack extracted into $SITE in $(( ($(date +%s%N) - t0) / 1000000 )) ms; nvidia/: $(ls "$SITE/nvidia" 2>/dev/null | tr '\n' ' ')"
# PRECOMPILE=1: byte-compile the stack on every core once it is staged (its wheels are unzipped,
# so they carry no .pyc and the first process on a host compiles each module it imports, one at
# a time). Timed, so a session can weigh it against the first start's time to the GPU; a call cut
# off inside it leaves the stack staged (each .pyc is written whole, or not at all).
if [ "${PRECOMPILE:-0}" = 1 ]; then
  t1=$(date +%s%N)
  python3 -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || echo "compileall: some files did not compile (left to import time)"
  echo "stack precompiled in $(( ($(date +%s%N) - t1) / 1000000 )) ms ($(find "$SITE" -name '*.pyc' | wc -l) .pyc)"
fi
