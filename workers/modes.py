"""Prefill modes by name: each turns the server's blend setting into a PrefillPlan, what the one prefill
pipeline (workers/pipeline.py) runs.

    full     plain prefill of every prompt token
    prefix   the system-prompt prefix block reused as an exact prefix, the rest prefilled (vLLM's prefix cache)
    reuse    stored chunk KV placed after the prefix, nothing recomputed (only the question and separators)
    blend    stored chunk KV plus CacheBlend's selective recompute (workers/blend.py); a server setting
             whose ratio is at or above its `exact_from` runs as `prefix` instead, exactly

A new mode is one `@prefill_mode(NAME)` function (research/ registers its own, e.g. `shift`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvstore.registry import Registry, registrar
from workers.blend import BlendConfig


@dataclass(frozen=True)
class PrefillPlan:
    mode: str
    stored_prefix: bool = True  # the system-prompt prefix comes from its stored block (an exact prefix)
    stored_chunks: bool = True  # stored chunk KV is placed; False: every token after the prefix is prefilled
    blend: BlendConfig | None = None  # selective recompute over the stored chunks; None: nothing (plain reuse)
    # the model's context drift added to every stored chunk entry first: None = as `blend` says
    # (its context_drift, when something is recomputed or a chunk was compressed at ingest); True / False
    shift: bool | None = None
    # an exact plan standing in for this blend setting (BlendConfig.exact: blending would save too little)
    exact_for: BlendConfig | None = None


PlanFor = Callable[[BlendConfig], PrefillPlan]  # the server's blend setting -> the plan
PREFILL_MODES: Registry = Registry()  # name -> PlanFor; research/ registers more (kvstore/plugins.py)
prefill_mode = registrar(PREFILL_MODES, "prefill mode")


def plan_for(mode: str, setting: BlendConfig) -> PrefillPlan:
    """The plan of `mode` (a name in PREFILL_MODES; requests are checked against it) under `setting`."""
    return PREFILL_MODES[mode](setting)


@prefill_mode("full")
def full(setting: BlendConfig) -> PrefillPlan:
    return PrefillPlan("full", stored_prefix=False, stored_chunks=False)


@prefill_mode("prefix")
def prefix(setting: BlendConfig) -> PrefillPlan:
    return PrefillPlan("prefix", stored_chunks=False)


@prefill_mode("reuse")
def reuse(setting: BlendConfig) -> PrefillPlan:
    return PrefillPlan("reuse", shift=False)


@prefill_mode("blend")
def blend(setting: BlendConfig) -> PrefillPlan:
    if setting.exact:  # at this ratio an exact prefill costs little more: prefix + exact head, the rest prefilled
        return PrefillPlan("blend", stored_chunks=False, exact_for=setting)
    return PrefillPlan("blend", blend=setting)
