"""A/B in one process, alternated: blend's choice of tokens computing fresh q/k/v of every candidate and dropping q
(before) against k/v alone (runner.kv, after). The engine's own chunk source, 3 bench prompts, on its thread."""
import sys
from engine_prompts import ab_attribute, engine_and_prompts

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
eng, layouts = engine_and_prompts()
r = eng.runner
runner_type, kv_alone = type(r), type(r).kv
with_q = lambda self, layer, normed, positions: self.qkv(layer, normed, positions)[1:]  # noqa: E731
ab_attribute(eng, layouts, runner_type, "kv", {"before": with_q, "after": kv_alone}, ROUNDS)
eng.close()
