"""argv: rounds. A/B in one process, alternated: query blocks by dynamic programming as shipped (key-rows + 3000 a
call) against the same with blocks of at most 32 rows charged 11% more key-rows (SDPA splits a block of <= 32
rows into 9 head tasks, which leave one of 2 threads idle a ninth of the time). The engine's own chunk source,
3 bench prompts, ratios 0.15 / 0.3 / 0.5."""
import statistics, sys
import torch
import workers.attention as attention
from engine_prompts import engine_and_prompts, timed_blend

shipped = attention.query_blocks


def balanced(q_positions, kv_positions, window=None, grain=16, call_cost=3000, max_rows=256):
    """attention.query_blocks with the small-block charge (same preconditions)."""
    seq = q_positions.numel()
    if kv_positions.dim() != 1 or seq <= grain or not bool((kv_positions[1:] > kv_positions[:-1]).all()):
        return None
    if not bool((q_positions[1:] >= q_positions[:-1]).all()):
        return None
    cuts = torch.cat([torch.arange(0, seq, grain), torch.tensor([seq])])
    ends = torch.searchsorted(kv_positions, q_positions[cuts[1:] - 1], right=True).tolist()
    firsts = [0] * (len(cuts) - 1)
    if window is not None:
        firsts = torch.searchsorted(kv_positions, q_positions[cuts[:-1]] - window + 1).tolist()
    cuts = cuts.tolist()
    best, back = [0] + [None] * (len(cuts) - 1), [0] * len(cuts)
    reach = max(1, max_rows // grain)
    for j in range(1, len(cuts)):
        best[j], back[j] = min((best[i] + (cuts[j] - cuts[i]) * (ends[j - 1] - firsts[i])
                                * (1.11 if cuts[j] - cuts[i] <= 32 else 1.0) + call_cost, i)
                               for i in range(max(0, j - reach), j))
    if best[-1] >= seq * (ends[-1] - firsts[0]) * (1.11 if seq <= 32 else 1.0) + call_cost:
        return None
    blocks, j = [], len(cuts) - 1
    while j > 0:
        i = back[j]
        blocks.append((cuts[i], cuts[j], firsts[i], ends[j - 1]))
        j = i
    return blocks[::-1] if len(blocks) > 1 else None


ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
eng, prompts = engine_and_prompts()
ratios = (0.15, 0.3, 0.5)
variants = {"shipped": shipped, "balanced": balanced}
t = {(v, x): [] for v in variants for x in ratios}
for i in range(ROUNDS):
    for v in (("shipped", "balanced") if i % 2 == 0 else ("balanced", "shipped")):
        attention.query_blocks = variants[v]
        for x in ratios:
            t[v, x].append(sum(timed_blend(eng, layout, x) for layout in prompts) / len(prompts))
attention.query_blocks = shipped
for x in ratios:
    a, b = statistics.median(t["shipped", x]), statistics.median(t["balanced", x])
    print(f"{x}: shipped {a * 1e3:6.1f} ms  balanced {b * 1e3:6.1f} ms  ({a / b:.3f}x)")
eng.close()
