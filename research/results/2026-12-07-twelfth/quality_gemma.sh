#!/bin/sh
# Gemma 3 270M (heads of 256, sliding windows) under bf16 and bf16-attention on the quality suite's dev split,
# 2 prompts a family: does the default chosen on SmolLM2 hold for the second model? quality-gemma-dev-<kernel>.json
for k in bf16 bf16-attention; do
  RAY_AUTH_MODE=disabled timeout 2400 /work/main/.venv/bin/ragkv bench quality --model gemma3-270m --split dev \
    --per-family 2 --sizes 1100 --configs full blend@0.5 --prefill-kernel $k --json quality-gemma-dev-$k.json \
    > quality-gemma-dev-$k.log 2>&1
done
echo done > quality-gemma.done
