"""End-to-end servers: real `ragkv serve` subprocesses with the default model and temp disk stores."""

from __future__ import annotations

import pytest
from serving_helpers import ServerProcess, self_signed_cert

TOKEN = "s3cret-token"


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """Plaintext, no auth, metrics on."""
    proc = ServerProcess(tmp_path_factory.mktemp("serve-plain"), metrics=True).start()
    yield proc
    proc.terminate()


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def guarded_server(tmp_path_factory, tls_cert):
    """TLS + bearer token + a batch of two and a queue of one (for the queue-full case)."""
    cert, key = tls_cert
    proc = ServerProcess(tmp_path_factory.mktemp("serve-guarded"), "--token", TOKEN, "--tls-cert", str(cert),
                         "--tls-key", str(key), "--max-queue", "1", "--max-batch", "2").start()
    yield proc
    proc.terminate()


@pytest.fixture(scope="session")
def client(server):
    from client import RagKVClient

    with RagKVClient(server.target, timeout=60) as c:
        yield c


CHUNKS = ["The capital of France is Paris.", "Bananas are yellow.", "Mount Everest is 8849 metres tall."]


@pytest.fixture(scope="session")
def refs(client):
    return client.ingest(CHUNKS)
