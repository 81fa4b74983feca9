#!/bin/sh
# bf16 against bf16-attention on the quality suite's dev split, 8 prompts a family (choosing the default on dev),
# one run after the other: quality-dev8-<kernel>.json / .log
for k in bf16 bf16-attention; do
  RAY_AUTH_MODE=disabled timeout 2400 /work/main/.venv/bin/ragkv bench quality --split dev --per-family 8 --sizes 1100 \
    --configs full blend@0.15 --prefill-kernel $k --json quality-dev8-$k.json > quality-dev8-$k.log 2>&1
done
echo done > quality-dev8.done
