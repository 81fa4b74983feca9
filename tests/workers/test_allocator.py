"""retain_freed_memory: a large tensor freed and allocated again reuses its pages (no page faults)."""

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys, threading
import torch
from workers.allocator import retain_freed_memory
took = retain_freed_memory() if sys.argv[1] == "retain" else None
faults = []
def work():  # in a thread, as the engine's scheduler allocates
    n = 64 << 18  # 64 MiB of fp32: over glibc's largest dynamic mmap threshold (32 MiB)
    # the heap first grows by about ten copies (each 64-byte-aligned request needs a little more than the
    # block freed before it), then freed blocks have coalesced and are reused
    for _ in range(14):
        torch.zeros(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        torch.zeros(n)
    faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (4 * 64 * 256))
thread = threading.Thread(target=work)
thread.start(); thread.join()
print(json.dumps({"took": took, "faults_per_page": faults[0]}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_pages_are_reused_only_when_retained():
    default, retained = probe("default"), probe("retain")
    assert retained["took"] is True
    assert default["faults_per_page"] > 0.9  # glibc's default: every 64 MiB allocation is a fresh mapping
    assert retained["faults_per_page"] < 0.1
