#!/bin/sh
# `ragkv bench blend` (8 chunks of 128 tokens: ~1,120-token prompts; or $CHUNK_TOKENS) for two checkouts,
# alternated: $1 = the base checkout's root (a git worktree), $2 = the new one's, $3 = rounds, $4 = output dir.
# Both run on the same virtual environment (this checkout's .venv) by PYTHONPATH.
set -e
base=$1; head=$2; rounds=${3:-2}; out=${4:-.}; tokens=${CHUNK_TOKENS:-128}; queries=${QUERIES:-6}
py=$(pwd)/.venv/bin/python
for i in $(seq 1 "$rounds"); do
  for side in base head; do
    root=$base; [ "$side" = head ] && root=$head
    (cd "$root" && RAY_AUTH_MODE=disabled PYTHONPATH="$root" "$py" -c "from ragkv.cli import main; main()" bench blend \
      --chunks 8 --chunk-tokens "$tokens" --queries "$queries" --settings gradual@0.15 gradual@0.3 gradual@0.5 \
      --json "$out/ab-$tokens-$side-$i.json" > "$out/ab-$tokens-$side-$i.log" 2>&1)
    echo "$side $i done"
  done
done
