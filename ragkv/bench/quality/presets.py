"""Named sets of configurations. Codec and policy lists are read from their registries, so a newly
registered codec or policy is measured without editing this file."""

from __future__ import annotations

RATIOS = (0.05, 0.15, 0.3, 0.5, 1.0)
BUDGETS = (0.2, 0.5)


def _codecs() -> list[str]:
    from kvstore.codecs import CODECS

    return sorted(CODECS)


def _policies() -> list[str]:
    from workers.eviction import POLICIES

    return sorted(POLICIES)


def blend_configs() -> list[str]:
    return ["prefix", "reuse", "blend", *(f"blend@{r}" for r in RATIOS), "reuse+codec:fp16",
            *(f"blend+codec:fp16@{r}" for r in RATIOS[1:4])]


def codec_configs() -> list[str]:
    return [*(f"codec:{c}" for c in _codecs()), *(f"blend+codec:{c}" for c in _codecs())]


def eviction_configs() -> list[str]:
    rows = [f"policy:{p}@{b}" for p in _policies() for b in BUDGETS]
    return rows + [f"policy:{p}@{BUDGETS[0]}:noprot" for p in _policies()]


def standard_configs() -> list[str]:
    """The default full run (~60 s a prompt on the 2-core box, 48 prompts: under an hour): reuse, blend at three ratios, every codec codec-only, the strongest policies at two budgets, and
    chunks compressed at ingest."""
    policies = [f"policy:{p}@{b}" for p in STANDARD_POLICIES for b in BUDGETS]
    return ["reuse", "blend", *(f"blend@{r}" for r in RATIOS[1:4]), *(f"codec:{c}" for c in _codecs()),
            *policies, *(f"policy:{p}@{BUDGETS[0]}:noprot" for p in STANDARD_POLICIES), "ingest:kvzip@0.3"]


STANDARD_POLICIES = ("snapkv", "tova", "kvzip")

PRESETS = {
    "quick": lambda: ["prefix", "reuse", "blend", "blend@1.0", "codec:fp16", "codec:int4", "policy:snapkv@0.5"],
    "blend": blend_configs,
    "codecs": codec_configs,
    "eviction": eviction_configs,
    "standard": standard_configs,
    "all": lambda: [*blend_configs(), *codec_configs(), *eviction_configs()],
}


def config_names(preset: str) -> list[str]:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    return PRESETS[preset]()
