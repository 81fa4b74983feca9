"""`ragkv serve --http-port` (and RAGKV_HTTP_PORT) as a real process: both APIs answer, SIGTERM drains both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from kvstore.testing import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_serve_with_http_port_from_env_and_sigterm(tmp_path):
    port, http_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAGKV_HTTP_PORT": str(http_port)}
    argv = [sys.executable, "-m", "ragkv.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--token", "tk",
            "--store", f"disk:{tmp_path / 'store'}"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # the one ready line, printed once both servers accept requests
        assert line.strip() == f"ragkv listening on 127.0.0.1:{port}"
        root = f"http://127.0.0.1:{http_port}"
        assert httpx.get(f"{root}/health").json() == {"status": "ok"}
        assert httpx.get(f"{root}/v1/models").status_code == 401
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="tk", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["default"]
        r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           extra_body={"documents": ["Bananas are yellow."],
                                                       "ragkv": {"recompute_ratio": 0.15}})  # blended: computed
        assert r.usage.completion_tokens >= 1 and r.model_extra["ragkv"]["chunks_computed"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == ""  # nothing printed after the ready line
        time.sleep(0.1)
        try:
            httpx.get(f"{root}/health", timeout=2)
            raise AssertionError("the HTTP port still answers after SIGTERM")
        except httpx.TransportError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
