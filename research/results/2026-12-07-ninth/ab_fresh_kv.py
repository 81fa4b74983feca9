"""A/B in one process, alternated: blend's choice of tokens computing fresh q/k/v of every candidate and dropping q
(before) against k/v alone (runner.kv, after). The engine's own chunk source, 3 bench prompts, on its thread."""
import statistics, sys
from engine_prompts import engine_and_prompts, timed_blend

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
eng, layouts = engine_and_prompts()
r = eng.runner
runner_type, kv_alone = type(r), type(r).kv
with_q = lambda self, layer, normed, positions: self.qkv(layer, normed, positions)[1:]  # noqa: E731
ratios = (0.15, 0.3, 0.5)
t = {(w, x): [] for w in ("before", "after") for x in ratios}


for i in range(ROUNDS):
    for w, fn in (("before", with_q), ("after", kv_alone)) if i % 2 == 0 else (("after", kv_alone), ("before", with_q)):
        runner_type.kv = fn
        for x in ratios:
            t[w, x].append(sum(timed_blend(eng, layout, x) for layout in layouts) / len(layouts))
runner_type.kv = kv_alone
for x in ratios:
    b, a = statistics.median(t["before", x]), statistics.median(t["after", x])
    print(f"{x}: before {b * 1e3:6.1f} ms  after {a * 1e3:6.1f} ms  ({b / a:.3f}x)")
eng.close()
