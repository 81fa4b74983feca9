#!/bin/sh
# One `ragkv` command for two checkouts, alternated: ab_cli.sh BASE HEAD OUT NAME ROUNDS ARGS...
# Run from this checkout's root. BASE / HEAD: the checkouts' roots (the session's start as a git worktree, and
# this one), run on this checkout's .venv by PYTHONPATH; each run writes OUT/NAME-{base,head}-ROUND.json and .log.
# The session's runs:
#   ab_cli.sh B H OUT ab-128 2 bench blend --chunks 8 --chunk-tokens 128 --queries 6 \
#       --settings gradual@0.15 gradual@0.3 gradual@0.5           (ab-128-*; a third round -> ab-128-*-3)
#   ab_cli.sh B H OUT ab-256 1 bench blend --chunks 8 --chunk-tokens 256 --queries 4 \
#       --settings gradual@0.15 gradual@0.3 gradual@0.5           (ab-256-*, twice)
#   ab_cli.sh B H OUT quality 1 bench quality --split test --sizes 1100 --configs full blend@0.15 blend@0.5
#                                                                 (quality-{base,head}.json)
#   ab_cli.sh B H OUT gemma 1 bench blend --model gemma3-270m --chunks 8 --chunk-tokens 128 --queries 6
#                                                                 (gemma-{base,head}.json)
set -e
base=$1; head=$2; out=$3; name=$4; rounds=$5; shift 5
py=$(pwd)/.venv/bin/python
for i in $(seq 1 "$rounds"); do
  for side in base head; do
    root=$base; [ "$side" = head ] && root=$head
    (cd "$root" && RAY_AUTH_MODE=disabled PYTHONPATH="$root" "$py" -c "from ragkv.cli import main; main()" "$@" \
      --json "$out/$name-$side-$i.json" > "$out/$name-$side-$i.log" 2>&1)
    echo "$name $side $i done"
  done
done
