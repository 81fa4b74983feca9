"""Gradual's choice of tokens (Selection.keep at layers 2-4) alone: torch profiler over the blend bench's first
prompt at 0.15, on the scheduler's thread, the engine's own stored chunks."""
import sys, time, torch
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, timed_blend
import workers.blend as blend

eng, layouts = engine_and_prompts(seeds=(0,))
original = blend.make_selection
prof = torch.profiler.profile(record_shapes=True)
spent = []


class Profiled:
    def __init__(self, inner): self.inner = inner
    def __getattr__(self, name): return getattr(self.inner, name)
    def keep(self, *args):
        t = time.perf_counter()
        with torch.profiler.record_function("keep"):
            out = self.inner.keep(*args)
        spent.append(time.perf_counter() - t)
        return out


for _ in range(3):
    timed_blend(eng, layouts[0], 0.15)
blend.make_selection = lambda config: Profiled(original(config))
spent.clear()
timed_blend(eng, layouts[0], 0.15)
print("keep without profiler", round(sum(spent) * 1e3, 2), "ms over", len(spent), "layers")
def run():
    with prof:
        timed_blend.__wrapped__(eng, layouts[0], 0.15) if hasattr(timed_blend, "__wrapped__") else None
spent.clear()
def profiled():
    from workers.pipeline import run_prefill
    from workers.modes import plan_for
    from workers.blend import BlendConfig
    source = eng.chunks.for_request("", [None] * 8, lambda: False)
    with prof:
        run_prefill(eng.runner, layouts[0], plan_for("blend", BlendConfig(recompute_ratio=0.15)), source, eng.config.chunk_form)
eng.scheduler.call(profiled)
events = [e for e in prof.events() if e.name == "keep"]
print("keep under profiler", [round(e.cpu_time_total / 1e3, 2) for e in events], "ms")
import collections
for e in [e for e in events if e.cpu_time_total > 1000]:  # the check layers: the ops inside, by self time
    inside = collections.Counter()
    stack = list(e.cpu_children)
    while stack:
        c = stack.pop()
        inside[(c.name, str(c.input_shapes)[:70])] += c.self_cpu_time_total
        stack.extend(c.cpu_children)
    print(f"keep {e.cpu_time_total / 1e3:.2f} ms:")
    for (name, shapes), us in inside.most_common(12):
        print(f"   {us / 1e3:6.3f} ms  {name}  {shapes}")
eng.close()
