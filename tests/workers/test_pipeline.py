"""The one prefill pipeline (workers/pipeline.py): every path to a first token goes through `run_prefill`.

Static: `fuse_chunks` and `recompute` are called in one place, and the engine's prefill step,
calibration, `ragkv check` and the quality suite call `run_prefill`. At run time: each of them runs
the pipeline's own `recompute` (spied on the pipeline module, the one place that calls it)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import workers.pipeline as pipeline
from workers.blend import BlendConfig
from workers.modes import PREFILL_MODES, plan_for
from workers.pipeline import HeldChunks, Stopwatch, run_prefill
from workers.prompt import build_prompt

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("client", "ragkv", "workers", "kvstore")
CALLERS = ("workers/steps.py", "workers/calibration.py", "workers/selfcheck.py", "ragkv/bench/quality/configs.py",
           "ragkv/bench/quality/evaluate.py")


def _calls(name: str) -> set[str]:
    """Product files (relative paths) that call a function named `name`."""
    found = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                    if called == name:
                        found.add(str(path.relative_to(ROOT)))
    return found


def test_the_cache_is_fused_and_recomputed_in_one_place():
    assert _calls("fuse_chunks") == {"workers/pipeline.py"}
    assert _calls("recompute") == {"workers/pipeline.py"}


def test_engine_calibration_check_and_quality_suite_call_the_pipeline():
    assert set(CALLERS) <= _calls("run_prefill")


def test_modes_are_plans():
    assert set(PREFILL_MODES) >= {"full", "prefix", "reuse", "blend"}
    setting = BlendConfig(recompute_ratio=0.3)
    assert plan_for("reuse", setting).blend is None and plan_for("reuse", setting).shift is False
    assert plan_for("blend", setting).blend == setting
    assert not plan_for("full", setting).stored_prefix and not plan_for("prefix", setting).stored_chunks


def test_stopwatch_adds_up_stages():
    parts: dict[str, float] = {}
    watch = Stopwatch(parts)
    for _ in range(2):
        with watch.stage("fuse"):
            pass
    assert set(parts) == {"fuse"} and parts["fuse"] >= 0


def test_check_calibration_and_quality_suite_run_the_pipelines_recompute(runner, monkeypatch):
    from ragkv.bench.quality.configs import parse_config
    from workers import calibration
    from workers.selfcheck import check_zero_ratio

    ran = []
    real = pipeline.recompute

    def spy(*args, **kwargs):
        ran.append(kwargs.get("observer"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "recompute", spy)
    assert check_zero_ratio(runner).passed and len(ran) == 2  # blend at 0 and reuse

    texts = ("Alpha beta gamma delta.", "Epsilon zeta eta theta.")
    layout = build_prompt(runner.tokenizer, "", [runner.tokenize(t) for t in texts], "Which letters?")
    held = HeldChunks(runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(runner.tokenize(t)) for t in texts])

    class Ctx:  # the quality suite's per-prompt context, as much of it as a blend config reads
        def __init__(self, model):
            self.runner, self.layout, self.default_blend, self.chunk_form, self.codec = (
                model, layout, BlendConfig(), "doc", "fp16")

        def prefix_kv(self):
            return held.prefix_kv

        def stored_chunks(self, codec, form):
            return held.chunk_kvs

    ran.clear()
    prepared = parse_config("blend@0.3").prepare(Ctx(runner))
    assert len(ran) == 1 and torch.isfinite(prepared.logits).all() and prepared.stats["recompute_ratio"] == 0.3

    class Prompt:
        family, system_prompt, chunks, question, max_new_tokens = "f", "", texts, "Which letters?", 2

        def correct(self, text):
            return True

    from kvstore.store import BlockStore

    store = BlockStore(None, "fp16", runner.fingerprint)
    ran.clear()
    calibration._Prepared(runner, Prompt(), store, store).run(runner, BlendConfig(recompute_ratio=0.3))
    assert len(ran) == 1


def test_full_plan_equals_the_runner_forward(runner):
    layout = build_prompt(runner.tokenizer, "", [runner.tokenize("Alpha beta gamma delta.")], "Which?")
    out = run_prefill(runner, layout, plan_for("full", BlendConfig()))
    from workers.cache import KVCache

    direct = runner.forward(torch.tensor(layout.token_ids), torch.arange(layout.num_tokens),
                            KVCache.empty(runner.shape.num_layers))
    assert torch.equal(out.logits, direct)  # the same calls, the same kernels: bit for bit
    assert out.stats.compute_fraction == 1.0 and out.stats.recomputed_tokens == layout.num_tokens
