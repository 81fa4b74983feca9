"""Per-model self-check: is blending valid for this model? (`ragkv check`)

Three properties, each measured on the loaded model:
- re-rotation is exact: stored keys moved by a RoPE delta equal keys computed at the target positions;
- recompute_ratio = 1 reproduces full-prefill logits;
- recompute_ratio = 0 equals plain reuse.
A model whose RoPE variant cannot be re-rotated fails the first check instead of producing garbled output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.blend import BlendConfig
from workers.cache import KVCache
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import build_prompt
from workers.rope import rerotate_keys

CHECK_TEXTS = (
    "The lighthouse keeper of Marrow Point counted ships every evening and wrote their names in a green ledger.",
    "Copper kettles were hammered by hand in the old quarter, each one stamped with the smith's own mark.",
    "A slow river bends around the hill, and in autumn the orchards along its banks smell of cider.",
)


@dataclass(frozen=True)
class CheckResult:
    name: str
    max_error: float
    tolerance: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.max_error <= self.tolerance


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-12))


@torch.inference_mode()
def check_rerotation(runner, delta: int = 137, tolerance: float = 1e-4) -> CheckResult:
    if not runner.can_rerotate:
        return CheckResult("rerotation", float("inf"), tolerance, f"rope type {runner.rope_type!r} is not re-rotatable")
    token_ids = runner.tokenize(CHECK_TEXTS[0])
    stored = runner.chunk_kv(token_ids).keys  # positions 0..n-1
    ids = torch.tensor(token_ids, device=runner.device)
    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(ids, torch.arange(delta, delta + len(token_ids), device=runner.device), cache)
    target = cache.to_chunk(token_ids).keys
    moved = rerotate_keys(stored, delta, runner.inv_freq)
    return CheckResult("rerotation", _relative(moved, target), tolerance, f"delta={delta}, {len(token_ids)} tokens")


def _blend_logits(runner, ratio: float, mode: str = "blend") -> tuple[torch.Tensor, torch.Tensor]:
    """(`mode`'s logits at `ratio` through the prefill pipeline, full prefill's logits) on a three-chunk prompt."""
    chunks = [runner.tokenize(text) for text in CHECK_TEXTS]
    layout = build_prompt(runner.tokenizer, "", chunks, "What did the lighthouse keeper count?")
    held = HeldChunks(runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(c) for c in chunks])
    # with the model's context drift, as blend runs by default
    logits = run_prefill(runner, layout, plan_for(mode, BlendConfig(recompute_ratio=ratio)), held).logits
    full = run_prefill(runner, layout, plan_for("full", BlendConfig())).logits
    return logits, full


@torch.inference_mode()
def check_full_ratio(runner, tolerance: float = 1e-3) -> CheckResult:
    blended, full = _blend_logits(runner, 1.0)
    return CheckResult("ratio_1_equals_full", _relative(blended, full), tolerance, "relative max |logit diff|")


@torch.inference_mode()
def check_zero_ratio(runner, tolerance: float = 1e-3) -> CheckResult:
    blended, _ = _blend_logits(runner, 0.0)
    reused, _ = _blend_logits(runner, 0.0, mode="reuse")
    return CheckResult("ratio_0_equals_reuse", _relative(blended, reused), tolerance, "relative max |logit diff|")


def run_self_check(runner) -> list[CheckResult]:
    return [check_rerotation(runner), check_full_ratio(runner), check_zero_ratio(runner)]
