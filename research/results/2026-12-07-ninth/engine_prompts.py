"""The set-up the ninth session's engine-side scripts share: an engine over a fresh disk store (default codec,
`auto` kernel, no sequence tree), the blend bench's prompts (8 chunks of 128 tokens, seeds 0, 8, 9) ingested
through it, and a blend prefill of one of them over the engine's own stored chunks, timed on its thread."""
import statistics, tempfile, time
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest


def engine_and_prompts(seeds=(0, 8, 9)):
    """-> (engine, prompt layouts): each prompt's chunks stored by one plain-reuse request."""
    retain_freed_memory()
    eng = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False))
    r, layouts = eng.runner, []
    for seed in seeds:
        q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=seed)[0]
        eng.generate(GenerateRequest(question=q.question, chunks=q.chunks, mode="reuse", max_new_tokens=1))
        layouts.append(build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question))
    return eng, layouts


def mode_plans(ratios=(0.15, 0.3, 0.5)) -> dict:
    """{"full", "reuse", ratio...: PrefillPlan}: the modes the eleventh session's scripts time and compare."""
    plans = {"full": plan_for("full", BlendConfig()), "reuse": plan_for("reuse", BlendConfig())}
    return {**plans, **{x: plan_for("blend", BlendConfig(recompute_ratio=x)) for x in ratios}}


def prefill_on_thread(eng, layout, plan):
    """(seconds, Prefilled) of one prefill under `plan` over the engine's stored chunks, on the scheduler's thread."""
    def one():
        source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
        start = time.perf_counter()
        out = run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
        return time.perf_counter() - start, out
    return eng.scheduler.call(one)


def timed_blend(eng, layout, ratio: float) -> float:
    """Seconds of one blend prefill at `ratio` over the engine's stored chunks, on the scheduler's thread."""
    def one():
        source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
        start = time.perf_counter()
        run_prefill(eng.runner, layout, plan_for("blend", BlendConfig(recompute_ratio=ratio)), source,
                    eng.config.chunk_form)
        return time.perf_counter() - start
    return eng.scheduler.call(one)


def alternate(eng, layouts, names, use, ratios, rounds: int) -> dict:
    """-> {(name, ratio): [seconds]}: per round, each variant in turn (the order rotated every round; `use(name)`
    puts it in place), each ratio's blend prefill averaged over the prompts."""
    names = list(names)
    times = {(name, x): [] for name in names for x in ratios}
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            use(name)
            for x in ratios:
                times[name, x].append(sum(timed_blend(eng, layout, x) for layout in layouts) / len(layouts))
    return times


def report(times: dict, before: str, after: str, ratios) -> None:
    """One line per ratio: the two variants' medians and before / after."""
    for x in ratios:
        b, a = statistics.median(times[before, x]), statistics.median(times[after, x])
        print(f"{x}: {before} {b * 1e3:6.1f} ms  {after} {a * 1e3:6.1f} ms  ({b / a:.3f}x)")


def ab_attribute(eng, layouts, owner, attr: str, variants: dict, rounds: int, ratios=(0.15, 0.3, 0.5)) -> None:
    """Alternate the two `variants` of `owner.attr` (patched in turn, restored after), then `report` them."""
    original = getattr(owner, attr)
    try:
        times = alternate(eng, layouts, variants, lambda v: setattr(owner, attr, variants[v]), ratios, rounds)
    finally:
        setattr(owner, attr, original)
    report(times, *variants, ratios)


def ab_modes(eng, layouts, owner, attr: str, variants: dict, rounds: int, stage=None) -> None:
    """The eleventh session's A/B over every mode: the `variants` of `owner.attr` patched in turn (order rotated each
    round, restored after), each mode's prefill averaged over the prompts; prints per mode both medians, the
    speedup, blend's speedup over full within each variant and, with `stage(Prefilled) -> seconds`, that part too."""
    plans, names, original = mode_plans(), list(variants), getattr(owner, attr)
    times = {(v, m): [] for v in names for m in plans}
    parts = {(v, m): [] for v in names for m in plans}
    try:
        for i in range(rounds):
            for v in names[i % 2:] + names[:i % 2]:
                setattr(owner, attr, variants[v])
                for m, plan in plans.items():
                    runs = [prefill_on_thread(eng, layout, plan) for layout in layouts]
                    times[v, m].append(sum(t for t, _ in runs) / len(runs))
                    parts[v, m].append(sum(stage(o) for _, o in runs) / len(runs) if stage else 0.0)
    finally:
        setattr(owner, attr, original)
    med = {k: statistics.median(x) for k, x in times.items()}
    a_name, b_name = names
    for m in plans:
        a, b = med[a_name, m], med[b_name, m]
        line = f"{str(m):5s} {a_name} {a * 1e3:7.1f} ms  {b_name} {b * 1e3:7.1f} ms  ({a / b:.3f}x)"
        if stage:
            line += f"  part {statistics.median(parts[a_name, m]) * 1e3:5.1f} / {statistics.median(parts[b_name, m]) * 1e3:5.1f} ms"
        if m not in ("full", "reuse"):
            line += f"   vs full: {a_name} {med[a_name, 'full'] / a:.2f}x  {b_name} {med[b_name, 'full'] / b:.2f}x"
        print(line)
