#!/bin/sh
# One `ragkv` command under two prefill kernels of this checkout, alternated: ab_kernels.sh OUT NAME ROUNDS ARGS...
# Each run writes OUT/NAME-{base,head}-ROUND.json and .log (base: --prefill-kernel bf16, head: bf16-attention), so
# ../2026-12-07-eleventh/summary.py reads them. The session's runs:
#   ab_kernels.sh OUT kern-128 2 bench blend --chunks 8 --chunk-tokens 128 --queries 6 \
#       --settings gradual@0.15 gradual@0.3 gradual@0.5
set -e
out=$1; name=$2; rounds=$3; shift 3
py=$(pwd)/.venv/bin/python
for i in $(seq 1 "$rounds"); do
  for side in base head; do
    kernel=bf16; [ "$side" = head ] && kernel=bf16-attention
    RAY_AUTH_MODE=disabled "$py" -c "from ragkv.cli import main; main()" "$@" --prefill-kernel "$kernel" \
      --json "$out/$name-$side-$i.json" > "$out/$name-$side-$i.log" 2>&1
    echo "$name $side $i done"
  done
done
