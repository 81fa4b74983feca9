#!/bin/sh
# `ragkv bench blend --model gemma3-270m` (8 chunks of 128 tokens) for two checkouts, alternated once:
# $1 = the base checkout's root, $2 = the new one's, $3 = output dir. Same .venv (this checkout's), by PYTHONPATH.
set -e
base=$1; head=$2; out=${3:-.}
py=$(pwd)/.venv/bin/python
for side in base head; do
  root=$base; [ "$side" = head ] && root=$head
  (cd "$root" && RAY_AUTH_MODE=disabled PYTHONPATH="$root" "$py" -c "from ragkv.cli import main; main()" bench blend \
    --model gemma3-270m --chunks 8 --chunk-tokens 128 --queries 6 --json "$out/gemma-$side.json" \
    > "$out/gemma-$side.log" 2>&1)
  echo "$side done"
done
