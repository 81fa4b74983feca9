"""A/B in one process, alternated: a stored chunk placed by the one C pass (workers/rotary.c's ragkv_place: drift,
rotation, copy) against the torch ops it replaces (the tenth session's path: a shifted copy, a rotated copy, the
write), for full, reuse and blend at 0.15 / 0.3 / 0.5 over the engine's own stored chunks, 3 bench prompts, on the
scheduler's thread; "part" is the shift + fuse stages. argv: rounds (5). (Written when the pass was placement.c:
ab_place.log; the variant patched is placement.runs_native either way.)"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import ab_modes, engine_and_prompts
import workers.placement as placement

eng, layouts = engine_and_prompts()
ab_modes(eng, layouts, placement, "runs_native", {"torch": lambda *a: False, "one pass": placement.runs_native},
         int(sys.argv[1]) if len(sys.argv) > 1 else 5,
         stage=lambda out: out.stats.breakdown.get("shift", 0) + out.stats.breakdown.get("fuse", 0))
eng.close()
