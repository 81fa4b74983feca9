"""argv: rounds. A/B in one process, alternated: query blocks by dynamic programming as shipped (key-rows + 3000 a
call) against the same with blocks of at most 32 rows charged 11% more key-rows (SDPA splits a block of <= 32
rows into 9 head tasks, which leave one of 2 threads idle a ninth of the time). The engine's own chunk source,
3 bench prompts, ratios 0.15 / 0.3 / 0.5."""
import sys
import workers.attention as attention
from engine_prompts import ab_attribute, engine_and_prompts

shipped = attention.query_blocks


def balanced(q_positions, kv_positions, window=None, grain=16, call_cost=3000, max_rows=256):
    """attention.query_blocks with the small-block charge."""
    bounds = attention.block_bounds(q_positions, kv_positions, window, grain)
    if bounds is None:
        return None
    return attention.cheapest_blocks(
        bounds, lambda rows, keys: rows * keys * (1.11 if rows <= 32 else 1.0) + call_cost, max_rows // grain)


ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
eng, prompts = engine_and_prompts()
ab_attribute(eng, prompts, attention, "query_blocks", {"shipped": shipped, "balanced": balanced}, ROUNDS)
eng.close()
