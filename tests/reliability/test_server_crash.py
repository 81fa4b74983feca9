"""`ragkv serve` SIGKILLed mid-ingest, then restarted on the same disk store."""

from __future__ import annotations

import threading
import time

import pytest

from client import RagKVClient, RagKVError
from faults import check_disk_store
from servers import serving

pytestmark = pytest.mark.timeout(400)

TEXTS = [f"Entry {i}: the archive shelf {i} holds {i * 3} maps of the northern coast." for i in range(40)]


def test_sigkill_mid_ingest_then_restart_on_same_store(tmp_path):
    store = tmp_path / "store"
    errors: list[BaseException] = []
    with serving(tmp_path) as server:
        def ingest_all():
            with RagKVClient(server.target, timeout=120) as c:
                for i, text in enumerate(TEXTS):
                    try:
                        c.ingest([text], pin=i % 3 == 0)
                    except RagKVError as e:  # the server died under us: expected
                        errors.append(e)
                        return

        t = threading.Thread(target=ingest_all, daemon=True)
        t.start()
        deadline = time.monotonic() + 240
        while len(list(store.glob("*/*.blk"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()  # SIGKILL, mid-ingest
        t.join(60)
    assert errors, "the kill should have cut an ingest short"
    written = len(list(store.glob("*/*.blk")))
    assert 4 <= written < len(TEXTS)

    summary = check_disk_store(store)  # every visible block decodes; index, sizes, pins agree with the files
    assert summary["blocks"] == written and summary["pinned"] >= 1

    with serving(tmp_path) as server, RagKVClient(server.target, timeout=120) as c:  # same store
        refs = c.ingest(TEXTS[:written + 1])
        assert sum(r.cached for r in refs) == written  # every block that survived is reused (ids are stable)
        assert not refs[-1].cached
        result = c.generate("How many maps are on shelf 2?", chunks=[refs[2].id], max_new_tokens=4,
                            recompute_ratio=0.15)  # a ratio that blends: the surviving block is read
        assert result.stats["chunks_hit"] == 1
        stats = c.stats()["engine"]["store"]
        assert stats["corrupt"] == 0 and stats["foreign"] == 0
