"""A/B in one process, alternated: queries and keys rotated by the C pass (workers/rotary.py) against apply_rope's
torch ops, for full, reuse and blend at 0.15 / 0.3 / 0.5 over the engine's own stored chunks, 3 bench prompts, on
the scheduler's thread. argv: rounds (5)."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import ab_modes, engine_and_prompts
import workers.rotary as rotary

eng, layouts = engine_and_prompts()
ab_modes(eng, layouts, rotary, "rows_fit", {"torch": lambda *a: False, "C": rotary.rows_fit},
         int(sys.argv[1]) if len(sys.argv) > 1 else 5)
eng.close()
