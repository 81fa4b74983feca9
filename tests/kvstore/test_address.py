"""Content addresses: canonical, sensitive to every input, identical across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvstore_helpers import TEXT
from kvstore.address import chunk_address

ROOT = Path(__file__).resolve().parents[2]


def test_every_field_changes_the_address():
    base = chunk_address("fp", [1, 2, 3], "kivi2")
    assert len(base) == 64 and int(base, 16) >= 0
    assert base == chunk_address("fp", (1, 2, 3), {"name": "kivi2", "params": {"residual": 0, "group_size": 32}})
    others = {
        chunk_address("fp2", [1, 2, 3], "kivi2"),
        chunk_address("fp", [1, 2, 3, 0], "kivi2"),
        chunk_address("fp", [3, 2, 1], "kivi2"),
        chunk_address("fp", [1, 2, 3], "int8"),
        chunk_address("fp", [1, 2, 3], {"name": "kivi2", "params": {"group_size": 16}}),
        chunk_address("fp", [1, 2, 3], "kivi2", namespace="tenant-a"),
        # length prefixes: moving a boundary between fields changes the hash
        chunk_address("f", [1, 2, 3], "kivi2", namespace="p"),
    }
    assert base not in others and len(others) == 7


def test_same_text_same_address_in_another_process(runner):
    """The subprocess loads only the tokenizer and the fingerprint, not the model."""
    here = chunk_address(runner.fingerprint, runner.tokenize(TEXT), "kivi2")
    code = (
        "import json, sys\n"
        "from transformers import AutoTokenizer\n"
        "from workers.model import compute_fingerprint, resolve_model_dir\n"
        "from kvstore.address import chunk_address\n"
        "d = resolve_model_dir('default')\n"
        "ids = AutoTokenizer.from_pretrained(d)(sys.argv[1], add_special_tokens=False)['input_ids']\n"
        "print(json.dumps(chunk_address(compute_fingerprint(d), ids, 'kivi2')))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, TEXT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here
