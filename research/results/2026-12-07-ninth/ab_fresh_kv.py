"""A/B in one process, alternated: blend's choice of tokens computing fresh q/k/v of every candidate and dropping q
(before) against k/v alone (runner.kv, after). The engine's own chunk source, 3 bench prompts, on its thread."""
import statistics, sys
from engine_prompts import alternate, engine_and_prompts

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
eng, layouts = engine_and_prompts()
r = eng.runner
runner_type, kv_alone = type(r), type(r).kv
with_q = lambda self, layer, normed, positions: self.qkv(layer, normed, positions)[1:]  # noqa: E731
ratios = (0.15, 0.3, 0.5)
variants = {"before": with_q, "after": kv_alone}
t = alternate(eng, layouts, variants, lambda w: setattr(runner_type, "kv", variants[w]), ratios, ROUNDS)
runner_type.kv = kv_alone
for x in ratios:
    b, a = statistics.median(t["before", x]), statistics.median(t["after", x])
    print(f"{x}: before {b * 1e3:6.1f} ms  after {a * 1e3:6.1f} ms  ({b / a:.3f}x)")
eng.close()
