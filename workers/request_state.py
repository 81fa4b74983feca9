"""RequestState: what the engine knows of one request between its arrival and its result (typed, no dicts).

The engine makes it (layout, plan); the prefill step fills in what the prefill did; the engine reads it
back into the GenerateResult's stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from workers.modes import PrefillPlan
    from workers.pipeline import PrefillStats
    from workers.prompt import PromptLayout


@dataclass
class RequestState:
    layout: PromptLayout
    plan: PrefillPlan
    blend_setting: str  # where the plan's blend setting came from: default | calibrated | adaptive | request
    compressions: list[dict | None]  # per chunk: the spec a chunk given by id was ingested with, else None
    start: float  # perf_counter() when the engine took the request
    shadow: bool = False  # checked against a full prefill after its answer (workers/shadow.py)
    # set by the prefill step
    prefill: PrefillStats | None = None
    compressor: object | None = None  # token-level eviction (workers/eviction), when the request asks for it
    ttft_s: float = 0.0
    prompt_s: float = 0.0  # the prompt resolved (chunks tokenized or looked up, laid out) on the caller's thread
    queued_s: float = 0.0  # submitted, waiting for the scheduler to start its prefill
    first_logits: torch.Tensor | None = None  # [vocab], kept for a shadow check only

    def stats(self) -> dict:
        """The prefill's stats as GenerateResult.stats carries them (the compression's, when it ran)."""
        stats = {**self.prefill.as_dict(), "blend_setting": self.blend_setting, "prefill_s": self.ttft_s,
                 "queued_s": self.queued_s, "prompt_s": self.prompt_s}
        stats["breakdown"] = {"prompt": self.prompt_s, "queue": self.queued_s, **self.prefill.breakdown}
        if self.compressor is not None:
            stats["compression"] = self.compressor.stats()
        return stats
