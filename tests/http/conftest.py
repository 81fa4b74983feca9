"""The OpenAI-compatible API on loopback, in this process: gRPC + HTTP servers over one Engine on the
session's model (fp32 kernels, so greedy `full` equals transformers' generate) and a temp disk store."""

from __future__ import annotations

import pytest
from openai_helpers import TOKEN, Api

from ragkv.config import ServeConfig
from ragkv.server.admission import Admission
from ragkv.server.app import start_server
from ragkv.server.openai.app import HttpSettings, start_http
from workers.batching.scheduler import BatchConfig
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig



@pytest.fixture(scope="session")
def http_engine(runner, tmp_path_factory):
    # no context drift: a fresh machine would measure it for the fp32 kernel first (minutes); blended at every
    # ratio (a BlendConfig of its own, not the server's setting, which serves its default ratio exactly)
    config = EngineConfig(store=f"disk:{tmp_path_factory.mktemp('http-store')}/blocks", prefill_kernel="fp32",
                          batch=BatchConfig(decode_kernel="fp32"), use_calibration=False,
                          blend=BlendConfig(context_drift=False))
    engine = Engine(config, runner)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def api(http_engine):
    """Plain: no token. gRPC (for the SDK's ingest) and HTTP share the admission queue and the metrics."""
    running = start_server(ServeConfig(host="127.0.0.1", port=0), http_engine)
    http = start_http("127.0.0.1", 0, running.engine, running.admission, running.metrics,
                      HttpSettings(models=("default",)))
    yield Api(http_engine, running, http)
    http.stop(5)
    running.drain(5)


@pytest.fixture(scope="session")
def guarded(http_engine, api):
    """A token, one slot and no queue: the test holds the slot to see 429."""
    admission = Admission(max_queue=0, slots=1)
    http = start_http("127.0.0.1", 0, api.running.engine, admission, api.running.metrics,
                      HttpSettings(models=("default",), token=TOKEN, max_body_bytes=64 << 10))
    yield http, admission
    http.stop(5)
