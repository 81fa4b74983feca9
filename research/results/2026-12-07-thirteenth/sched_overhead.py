"""Where a batched server's decode time goes: 8 concurrent blend requests (48 new tokens, 4 short chunks, ratio 0.15)
through an in-process engine (max batch 16), with the scheduler's decode step, its _retire (sampling, emitting) and
prefills timed on the scheduler thread; the rest of the wall is the loop itself."""
import tempfile, threading, time
from collections import defaultdict
from workers.batching import scheduler as sched
from workers.batching.scheduler import BatchConfig
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest
from ragkv.bench.load import corpus

spent = defaultdict(float)
calls = defaultdict(int)


def timed(name, fn):
    def wrapper(self, *a, **k):
        t = time.perf_counter()
        try:
            return fn(self, *a, **k)
        finally:
            spent[name] += time.perf_counter() - t
            calls[name] += 1
    return wrapper


for name in ("_run_decode", "_retire", "_run_prefill"):
    setattr(sched.Scheduler, name, timed(name, getattr(sched.Scheduler, name)))

eng = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False, batch=BatchConfig(max_batch=16),
                          blend=BlendConfig(recompute_ratio=0.15)))
chunks = corpus(16)
groups = [chunks[i:i + 4] for i in range(0, 16, 4)]
eng.ingest(chunks)
reqs = [GenerateRequest(question=f"Summarize passage set {i}.", chunks=groups[i % 4], mode="blend", max_new_tokens=48,
                        recompute_ratio=0.15) for i in range(8)]
eng.generate(reqs[0])  # warm (stores the chunks)
for i in range(4):
    eng.generate(GenerateRequest(question="warm", chunks=groups[i], mode="reuse", max_new_tokens=1))
for rounds in range(2):
    spent.clear(); calls.clear()
    out = [None] * 8
    def go(i):
        out[i] = eng.generate(reqs[i])
    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    t = time.perf_counter()
    for th in threads: th.start()
    for th in threads: th.join()
    wall = time.perf_counter() - t
    tokens = sum(len(o.token_ids) for o in out)
    print(f"round {rounds}: wall {wall:.2f} s, {tokens} tokens; decode steps {calls['_run_decode']} "
          f"{spent['_run_decode']:.2f} s ({spent['_run_decode'] / max(calls['_run_decode'], 1) * 1e3:.1f} ms/step), "
          f"retire {spent['_retire']:.3f} s ({spent['_retire'] / max(calls['_retire'], 1) * 1e3:.2f} ms/call), "
          f"prefills {calls['_run_prefill']} {spent['_run_prefill']:.2f} s; "
          f"rest {wall - spent['_run_decode'] - spent['_retire'] - spent['_run_prefill']:.2f} s")
# one request alone
spent.clear(); calls.clear()
t = time.perf_counter(); o = eng.generate(reqs[0]); wall = time.perf_counter() - t
print(f"alone: wall {wall:.2f} s, {len(o.token_ids)} tokens; decode {spent['_run_decode']:.2f} s "
      f"({spent['_run_decode'] / max(calls['_run_decode'], 1) * 1e3:.1f} ms/step), retire {spent['_retire']:.3f}, "
      f"prefill {spent['_run_prefill']:.3f}")
eng.close()
