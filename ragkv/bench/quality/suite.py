"""The quality run: does an answer survive blending, a codec or eviction on prompts we did not tune on?

Families of RAG prompts (ragkv/bench/quality/families.py) in two splits with disjoint vocabularies:
`dev` for choosing defaults, `test` for the figures we quote. Every configuration runs on the same
prompts, side by side (evaluate.py). JSON per docs/benchmarks.md, "Quality suite":

    {"split", "available_splits", "codec", "configs",
     "families": {FAMILY: {"n", "prompt_tokens", "full_accuracy",
                           "accuracy": {CONFIG: f}, "agreement_vs_full": {CONFIG: f}, "kl_vs_full": {CONFIG: f},
                           "per_prompt": {"correct" | "agree": {CONFIG: [0|1 per prompt]}}}},
     "overall": {"accuracy": {...}, "agreement_vs_full": {...}, "kl_vs_full": {...}}}
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from ragkv.bench.quality.configs import parse_config
from ragkv.bench.quality.evaluate import evaluate_prompt
from ragkv.bench.quality.paired import per_prompt
from ragkv.bench.quality.pools import SPLITS
from ragkv.bench.quality.presets import config_names
from ragkv.bench.quality.prompts import make_prompts

METRICS = ("accuracy", "agreement_vs_full", "kl_vs_full", "kv_bytes_vs_full")


def run(quick: bool = False, progress: bool = True, split: str = "dev", families: list[str] | None = None,
        per_family: int | None = None, sizes: tuple[int, ...] | None = None, configs: list[str] | None = None,
        preset: str | None = None, codec: str | None = None, plots: str | None = None, model: str = "default",
        threads: int | None = 1, report: str | None = None, prefill_kernel: str | None = None,
        answer_tokens: int | None = None) -> dict:
    """threads: torch intra-op threads for the run (restored after); 1 is fastest on a small shared box.
    answer_tokens: every prompt's answer length instead of its family's (recorded in the result)."""
    import torch

    from workers.engine import EngineConfig, blend_setting
    from workers.runner import ModelRunner

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        runner = ModelRunner.load(model).with_kernel(prefill_kernel or EngineConfig.prefill_kernel)
        prefill_kernel = runner.kernel  # `auto` resolved: what ran
        codec = codec or EngineConfig().codec
        names = configs or config_names(preset or ("quick" if quick else "standard"))
        parsed = [parse_config(name) for name in dict.fromkeys(["full", *names])]
        prompts = make_prompts(split, lambda text: len(runner.tokenize(text)), families,
                               per_family or (1 if quick else 4), sizes or ((500,) if quick else (1100,)))
        if answer_tokens:
            prompts = [replace(p, max_new_tokens=answer_tokens) for p in prompts]
        default_blend, setting = blend_setting(EngineConfig(model=model, codec=codec), runner)
        result = _run(runner, prompts, parsed, codec, default_blend, progress)
        result["blend_default"] = {"setting": setting, "config": default_blend.name}
    finally:
        torch.set_num_threads(previous)
    result.update(split=split, available_splits=list(SPLITS), model=model, prefill_kernel=prefill_kernel)
    if answer_tokens:
        result["answer_tokens"] = answer_tokens
    if plots:
        from ragkv.bench.quality.report import write_plots

        result["plots"] = write_plots(result, plots)
    if report:
        from ragkv.bench.quality.report import markdown

        with open(report, "w") as f:
            f.write(markdown(result))
    return result


def _run(runner, prompts, configs, codec: str, default_blend, progress: bool) -> dict:
    from tqdm import tqdm

    start = time.perf_counter()
    outcomes: dict[str, list[dict]] = {}
    tokens: dict[str, list[int]] = {}
    with tqdm(total=len(prompts) * len(configs), desc="quality", disable=not progress) as bar:
        for prompt in prompts:
            bar.set_postfix_str(prompt.family)
            outcome = evaluate_prompt(runner, prompt, configs, codec, on_config=lambda _: bar.update(),
                                      default_blend=default_blend)
            outcomes.setdefault(prompt.family, []).append(outcome)
            tokens.setdefault(prompt.family, []).append(_prompt_tokens(runner, prompt))
    names = [c.name for c in configs]
    families = {family: _summarize(rows, tokens[family], names) for family, rows in outcomes.items()}
    overall = {metric: {name: statistics.fmean(f[metric][name] for f in families.values()) for name in names}
               for metric in METRICS}
    return {"codec": codec, "configs": names, "families": families, "overall": overall,
            "prompts": len(prompts), "elapsed_s": round(time.perf_counter() - start, 1),
            "answers": {family: [{name: o.text for name, o in row.items()} for row in rows][:2]
                        for family, rows in outcomes.items()}}


def merge(parts: list[dict]) -> dict:
    """One result from runs over disjoint families (run side by side, one per core), as one run writes it."""
    first = parts[0]
    if any(p["split"] != first["split"] or p["configs"] != first["configs"] for p in parts):
        raise ValueError("only runs of the same split and configs merge")
    if any(p.get("answer_tokens") != first.get("answer_tokens") for p in parts):
        raise ValueError("only runs with the same answer length merge")
    families = {name: f for p in parts for name, f in p["families"].items()}
    if len(families) != sum(len(p["families"]) for p in parts):
        raise ValueError("the runs to merge share a family")
    names = first["configs"]
    overall = {metric: {name: statistics.fmean(f[metric][name] for f in families.values()) for name in names}
               for metric in METRICS}
    return {**first, "families": families, "overall": overall, "prompts": sum(p["prompts"] for p in parts),
            "elapsed_s": max(p["elapsed_s"] for p in parts),
            "answers": {name: a for p in parts for name, a in p.get("answers", {}).items()}}


def _prompt_tokens(runner, prompt) -> int:
    from workers.prompt import build_prompt

    return build_prompt(runner.tokenizer, prompt.system_prompt, [runner.tokenize(c) for c in prompt.chunks],
                        prompt.question).num_tokens


def _summarize(rows: list[dict], tokens: list[int], names: list[str]) -> dict:
    mean = lambda values: statistics.fmean(values)  # noqa: E731
    return {
        "n": len(rows),
        "prompt_tokens": round(mean(tokens)),
        "full_accuracy": mean([float(r["full"].correct) for r in rows]),
        "accuracy": {n: mean([float(r[n].correct) for r in rows]) for n in names},
        "agreement_vs_full": {n: mean([float(r[n].agree) for r in rows]) for n in names},
        "kl_vs_full": {n: mean([r[n].kl for r in rows]) for n in names},
        "kv_bytes_vs_full": {n: mean([r[n].kv_bytes for r in rows]) for n in names},
        "per_prompt": per_prompt(rows, names),  # paired comparisons (paired.py) read these
    }
