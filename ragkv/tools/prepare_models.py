"""`python -m ragkv.tools.prepare_models`: convert every named model's GGUF once (make setup runs it).

The first load of a named model converts its GGUF into a safetensors copy under the cache directory
(15-60 s: Gemma's 262k-token tokenizer is most of it); set-up does it here, so that neither the first
request nor the test suite pays for it. Idempotent: a converted copy is kept.
"""

from __future__ import annotations

import sys


def main() -> int:
    from workers.model import NAMED_MODELS, converted_dir

    for name in NAMED_MODELS:
        print(f"model {name}: {converted_dir(name)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
