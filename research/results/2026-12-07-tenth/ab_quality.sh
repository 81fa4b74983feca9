#!/bin/sh
# `ragkv bench quality` on the held-out `test` split (1,100-token prompts) for two checkouts, one after the other:
# $1 = the base checkout's root, $2 = the new one's, $3 = output dir. Same .venv (this checkout's), by PYTHONPATH.
set -e
base=$1; head=$2; out=${3:-.}
py=$(pwd)/.venv/bin/python
for side in base head; do
  root=$base; [ "$side" = head ] && root=$head
  (cd "$root" && RAY_AUTH_MODE=disabled PYTHONPATH="$root" "$py" -c "from ragkv.cli import main; main()" bench quality \
    --split test --sizes 1100 --configs full blend@0.15 blend@0.5 --json "$out/quality-$side.json" \
    > "$out/quality-$side.log" 2>&1)
  echo "$side done"
done
