"""After ingest and 3 blend requests through a real gRPC server on loopback (in process), list every thread
with gdb: the libgomp workers alive are the OpenMP pools. Writes gdb-threads.txt; grep it for gomp_thread_start."""
import os, tempfile, threading, time, subprocess
from client import RagKVClient
from ragkv.config import ServeConfig
from ragkv.server.app import start_server
from workers.engine import Engine, EngineConfig
with tempfile.TemporaryDirectory() as tmp:
    engine = Engine(EngineConfig(store=f"disk:{tmp}"))
    server = start_server(ServeConfig(host="127.0.0.1", port=0), engine)
    with RagKVClient(f"127.0.0.1:{server.port}") as c:
        refs = c.ingest(["A short chunk about the lighthouse keeper and his ledger. " * 10] * 3)
        for _ in range(3):
            c.generate("What did the keeper count?", chunks=refs, mode="blend", max_new_tokens=8)
    time.sleep(0.5)
    out = subprocess.run(["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt 6"], capture_output=True, text=True, timeout=120).stdout
    open("gdb-threads.txt", "w").write(out)
    server.server.stop(0); engine.close()
