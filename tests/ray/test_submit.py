"""`ray job submit` of the precompute job to a real head node started on loopback (bounded, marked slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvstore.testing import free_port
from workers.chunk_forms import chunk_fingerprint
from workers.engine import EngineConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
# the job runs ragkv/, workers/, kvstore/: the rest of the repo (research/results alone is 7 MB) is not uploaded
UPLOAD_EXCLUDES = ["/research/", "/docs/", "/tests/", "/helm/", "/deploy/"]
DOCS = ["Glaciers carve U-shaped valleys; rivers carve V-shaped ones. Moraines mark where the ice stopped.",
        "The recipe needs two eggs, a cup of flour and a pinch of salt. Whisk the eggs before adding flour."]


def _ray(*args, env, timeout):
    exe = Path(sys.executable).with_name("ray")
    return subprocess.run([str(exe), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_precompute_through_ray_job_submit(redis_url, runner, tmp_path):
    from kvstore.backends.registry import open_backend
    from kvstore.codecs import DEFAULT_CODEC
    from workers.key_plan import codec_for_model
    from kvstore.store import BlockStore
    from workers.chunking import chunk_text

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(DOCS):
        (corpus / f"{i}.txt").write_text(doc)
    temp_dir = tempfile.mkdtemp(prefix="rj", dir="/tmp")
    port, dash = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    started = _ray("start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
                   "--num-cpus=1", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                   f"--dashboard-port={dash}", "--disable-usage-stats", env=env, timeout=120)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        job = _ray("job", "submit", "--address", f"http://127.0.0.1:{dash}", "--working-dir", ".",
                   "--runtime-env-json", json.dumps({"excludes": UPLOAD_EXCLUDES}), "--",
                   sys.executable, "-m", "ragkv.jobs.precompute", "--corpus", str(corpus), "--store", redis_url,
                   "--chunk-tokens", "64", "--workers", "1", "--no-progress", env=env, timeout=240)
        assert job.returncode == 0, (job.stdout[-3000:], job.stderr[-3000:])
        line = next(l for l in job.stdout.splitlines() if l.startswith('{"precompute"'))
        summary = json.loads(line)["precompute"]
        fingerprint = runner.with_kernel(EngineConfig.prefill_kernel).kv_fingerprint  # what the job's engines store with
        store = BlockStore(open_backend(redis_url), codec_for_model(DEFAULT_CODEC, runner),
                           chunk_fingerprint(fingerprint, runner.tokenizer))
        ids = {store.address_for(runner.tokenize(c)) for d in DOCS for c in chunk_text(runner.tokenizer, d, 64)}
        assert summary["computed"] == len(ids)
        assert set(store.backend.keys()) == ids
    finally:
        _ray("stop", "--force", env=env, timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)
