"""Configurations the quality suite compares, one small class per kind, registered by name.

A config name reads `KIND[:ARG][@NUMBER][:FLAG]`:

    full | prefix | reuse | shift | blend | blend@0.3 | blend:METHOD@0.3   (blend = the engine's setting, calibrated
                                                                    or default; @R keeps its method)
    codec:NAME              codec only: the exact full-prefill KV stored through NAME, question recomputed
    blend+codec:NAME[@R]    blend over chunks stored through NAME
    shift                   the `shift` mode: reuse after the model's context drift (workers/context_drift.py)
    blend+lead[:METHOD][@R] | reuse+lead     chunks in a named form (workers/chunk_forms.py), whatever the
    blend+alone[:METHOD][@R] | reuse+alone   engine's default form: after the fixed lead-in, or alone
    reuse+codec:NAME        reuse over chunks stored through NAME
    blend...:shift | :noshift     the model's context drift added first on / off (workers/context_drift.py)
    policy:NAME@BUDGET[:noprot]   eviction after the full prefill, protection on unless :noprot
    ingest:NAME@BUDGET[:reuse]    chunks compressed at ingest (query-agnostic NAME, e.g. kvzip), stored
                                  through the suite's codec, then blended (or reused)

`prepare(ctx)` returns what the answer is decoded from: the last prompt token's logits, the cache
and the decode hooks. `observer(ctx)` (optional) watches the one shared full prefill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar

from kvstore.registry import add_unique
from workers.blend import BlendConfig
from workers.generate import DecodeHooks
from workers.modes import PrefillPlan, plan_for
from workers.pipeline import HeldChunks, run_prefill

CONFIG_KINDS: dict[str, type["ConfigKind"]] = {}
_NAME_RE = re.compile(r"^(?P<kind>[a-z+]+)(?::(?P<arg>[A-Za-z0-9_.-]+?))?(?:@(?P<number>[0-9.]+))?(?::(?P<flag>[a-z]+))?$")


def config_kind(name: str):
    def add(cls: type["ConfigKind"]) -> type["ConfigKind"]:
        add_unique(CONFIG_KINDS, "config kind", name, cls)
        cls.kind = name
        return cls
    return add


@dataclass(frozen=True)
class Prepared:
    logits: object  # [1, vocab] logits of the last prompt token
    cache: object  # KVCache the answer is decoded over
    hooks: DecodeHooks = field(default_factory=DecodeHooks)
    stats: dict | None = None


@dataclass(frozen=True)
class ConfigKind:
    name: str
    kind: ClassVar[str] = ""

    @classmethod
    def parse(cls, name: str, arg: str | None, number: float | None, flag: str | None) -> "ConfigKind":
        _no_argument(name, arg, number, flag)
        return cls(name)

    def observer(self, ctx) -> Callable | None:
        return None

    def prepare(self, ctx) -> Prepared:
        raise NotImplementedError


def _no_argument(name: str, arg, number, flag) -> None:
    if arg or number is not None or flag:
        raise ValueError(f"config {name!r} takes no argument")


def parse_config(name: str) -> ConfigKind:
    match = _NAME_RE.match(name)
    if not match or match["kind"] not in CONFIG_KINDS:
        raise ValueError(f"unknown config {name!r}; kinds: {', '.join(sorted(CONFIG_KINDS))}")
    number = float(match["number"]) if match["number"] else None
    return CONFIG_KINDS[match["kind"]].parse(name, match["arg"], number, match["flag"])


@config_kind("full")
class Full(ConfigKind):
    def prepare(self, ctx) -> Prepared:
        return Prepared(ctx.full_logits, ctx.full_cache_copy())


@config_kind("prefix")
class Prefix(ConfigKind):
    def prepare(self, ctx) -> Prepared:
        logits, cache = ctx.prefix_prefill()
        return Prepared(logits, cache)


@dataclass(frozen=True)
class Blend(ConfigKind):
    """Stored chunks through `codec`, fused, then selective recompute (`reuse`: none)."""

    codec: str | None = None  # None: the suite's codec (the engine default)
    method: str | None = None  # None: BlendConfig's default selection method
    ratio: float | None = None  # None: BlendConfig's default ratio
    reuse: bool = False
    form: str | None = None  # how the chunks were computed (workers/chunk_forms.py); None: the engine's form
    shift: bool | None = None  # the model's context drift first (workers/context_drift.py); None: the default's

    @classmethod
    def parse(cls, name, arg, number, flag):
        if flag not in (None, "shift", "noshift"):
            raise ValueError(f"config {name!r}: the only flags are :shift and :noshift")
        if number is not None and not 0.0 <= number <= 1.0:
            raise ValueError(f"config {name!r}: recompute ratio must be in [0, 1]")
        if arg is not None:
            BlendConfig().named(arg)  # an unknown selection method: ValueError naming the registered ones
        shift = None if flag not in ("shift", "noshift") else flag == "shift"
        return cls(name, method=arg, ratio=number, shift=shift)

    def blend_config(self, default: BlendConfig | None = None) -> BlendConfig:
        """`default` (the engine's setting: calibrated, else its config) with this config's method / ratio."""
        config = default or BlendConfig()
        if self.ratio is not None:
            config = config.with_ratio(self.ratio)
        if self.method is not None:
            config = config.named(self.method)
        if self.shift is not None:
            config = replace(config, context_drift=self.shift)
        return config

    def chunks(self, ctx):
        return ctx.stored_chunks(self.codec or ctx.codec, self.form)

    def plan(self, ctx) -> PrefillPlan:
        """The engine's plan for this config's mode (workers/modes.py), with its flags."""
        plan = plan_for("reuse" if self.reuse else "blend", self.blend_config(ctx.default_blend))
        return replace(plan, shift=self.shift) if self.reuse else plan  # blend kinds: the setting's context_drift

    def prepare(self, ctx) -> Prepared:
        held = HeldChunks(ctx.prefix_kv(), self.chunks(ctx))
        out = run_prefill(ctx.runner, ctx.layout, self.plan(ctx), held, self.form or ctx.chunk_form)
        return Prepared(out.logits, out.cache, stats=out.stats.as_dict())


@config_kind("blend")
class BlendDefault(Blend):
    pass


@config_kind("reuse")
class Reuse(Blend):
    shifted: ClassVar[bool] = False  # the shift mode's context drift first

    @classmethod
    def parse(cls, name, arg, number, flag):
        _no_argument(name, arg, number, flag)
        return cls(name, reuse=True, shift=cls.shifted)


@config_kind("shift")
class Shift(Reuse):
    """The `shift` mode: reuse, every stored chunk entry shifted first by the model's context drift."""

    shifted: ClassVar[bool] = True


class InForm:
    """Mixin: the base kind's config, with its chunks computed in `form_name` (workers/chunk_forms.py)."""

    form_name: ClassVar[str] = ""

    @classmethod
    def parse(cls, name, arg, number, flag):
        return replace(super().parse(name, arg, number, flag), form=cls.form_name)


def _form_kinds() -> None:
    """blend+FORM[:METHOD][@R] / reuse+FORM / shift+FORM for every chunk form."""
    from workers.chunk_forms import CHUNK_FORMS

    for form in CHUNK_FORMS:
        for base, kind in ((Blend, "blend"), (Reuse, "reuse"), (Shift, "shift")):
            config_kind(f"{kind}+{form}")(type(f"{base.__name__}{form.title()}", (InForm, base), {"form_name": form}))


_form_kinds()


@config_kind("blend+codec")
class BlendCodec(Blend):
    @classmethod
    def parse(cls, name, arg, number, flag):
        if not arg or flag:
            raise ValueError(f"config {name!r}: expected blend+codec:NAME[@RATIO]")
        return cls(name, codec=arg, ratio=number)


@config_kind("reuse+codec")
class ReuseCodec(Blend):
    @classmethod
    def parse(cls, name, arg, number, flag):
        if not arg or number is not None or flag:
            raise ValueError(f"config {name!r}: expected reuse+codec:NAME")
        return cls(name, codec=arg, reuse=True)


@config_kind("codec")
class CodecOnly(Blend):
    """Codec error alone: each chunk's span of the exact full-prefill KV (computed in its real context)
    stored through the codec and decoded as a hit would, then only the tokens after the chunks run."""

    @classmethod
    def parse(cls, name, arg, number, flag):
        if not arg or number is not None or flag:
            raise ValueError(f"config {name!r}: expected codec:NAME")
        return cls(name, codec=arg, reuse=True)

    def chunks(self, ctx):
        return ctx.in_context_chunks(self.codec)


@config_kind("policy")
@dataclass(frozen=True)
class Eviction(ConfigKind):
    """Token eviction after the shared full prefill (the policy observed it), decode hooks keep the budget."""

    policy: str = ""
    budget: float | int = 1.0
    protect: bool = True

    @classmethod
    def parse(cls, name, arg, number, flag):
        if not arg or number is None or flag not in (None, "noprot"):
            raise ValueError(f"config {name!r}: expected policy:NAME@BUDGET[:noprot]")
        budget = number if "." in name.split("@")[1] else int(number)  # 0.2 = a fraction, 64 = tokens
        return cls(name, policy=arg, budget=budget, protect=flag is None)

    def observer(self, ctx):
        return ctx.compressor(self).observer

    def prepare(self, ctx) -> Prepared:
        compressor = ctx.compressor(self)
        cache = ctx.full_cache_copy()
        # kvzip's reconstruction pass depends on the prompt's full cache only: once per prompt and pass
        done = ctx.__dict__.setdefault("prepared_scores", {})
        key = compressor.prepare_key
        done[key] = compressor.prepare(ctx.runner, cache, ctx.layout.token_ids, (0, ctx.layout.suffix_start),
                                       done.get(key))
        stats = compressor.compress(cache)
        return Prepared(ctx.full_logits, cache, compressor.decode_hooks(), stats=stats)


@config_kind("ingest")
@dataclass(frozen=True)
class IngestCompressed(Blend):
    """Chunks compressed at ingest (workers/eviction/chunks.py) to BUDGET of their tokens by a query-agnostic
    policy, stored through the suite's codec as a hit decodes them, fused and blended; the cache is then
    compacted (the dropped entries really leave it)."""

    policy: str = ""
    budget: float | int = 1.0

    @classmethod
    def parse(cls, name, arg, number, flag):
        if not arg or number is None or flag not in (None, "reuse"):
            raise ValueError(f"config {name!r}: expected ingest:NAME@BUDGET[:reuse]")
        budget = number if "." in name.split("@")[1] else int(number)
        return cls(name, policy=arg, budget=budget, reuse=flag == "reuse")

    def chunks(self, ctx):
        from workers.eviction.chunks import compress_chunk
        from workers.requests import CompressionSpec

        spec = CompressionSpec(policy=self.policy, budget=self.budget)
        store = ctx.store(self.codec or ctx.codec)
        return [store.as_stored(compress_chunk(ctx.runner, kv, spec)[0])[1] for kv in ctx.exact_chunks]

    def prepare(self, ctx) -> Prepared:
        from workers.eviction.chunks import compact

        prepared = super().prepare(ctx)
        compact(prepared.cache)
        return prepared
