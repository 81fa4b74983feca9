"""Per-model blend calibration: the cheapest selection setting that keeps the answers of full prefill.

`calibrate` runs dev prompts (the quality suite's, passed in as data: this layer does not import
the benchmarks) through full prefill, plain reuse and every candidate `BlendConfig`, on the real
serving path (chunk KV through the store's codec, re-rotated and fused, selectively recomputed),
and records the cheapest candidate that meets the target:

- agreement with full (identical greedy tokens) >= `min_agreement`;
- accuracy within `max_accuracy_drop` of full;
- no family answered worse than plain reuse.

Cost is the deterministic token-layer count of the prefill against a full prefill's
(`compute_fraction` in the blend stats), so the same model, codec and prompts always give the
same choice. When nothing meets the target within `max_compute`, the best trade-off is
recorded with `target_met: false` and says so.

The record is JSON next to the model's converted copy (`ragkv-calibration-CODEC.json`; under the
cache dir when the model directory is read-only). It is reused while the model fingerprint, codec,
target, prompts and candidates are the same; `ragkv serve` takes its setting when a request gives
no recompute ratio.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

import torch

from workers.blend import BlendConfig
from workers.cache import KVCache
from workers.chunk_forms import DEFAULT_CHUNK_FORM, compute_chunk
from workers.chunk_source import PREFIX_CODEC
from workers.generate import SamplingParams, decode
from workers.key_plan import codec_for_model
from workers.model import beside_model, write_record
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import build_prompt

CALIBRATION_VERSION = 3  # 3: the one prefill pipeline, an exact prefix, the product's selection methods


class CalibrationPrompt(Protocol):
    family: str
    system_prompt: str
    chunks: tuple[str, ...]
    question: str
    max_new_tokens: int

    def correct(self, text: str) -> bool: ...


@dataclass(frozen=True)
class Target:
    min_agreement: float = 0.95
    max_accuracy_drop: float = 0.02
    max_compute: float = 0.25  # a useful speedup: at most this share of a full prefill's token-layers


@dataclass(frozen=True)
class Score:
    accuracy: float
    agreement: float
    compute_fraction: float
    kl: float = 0.0  # mean teacher-forced KL(full || this) over full's answer
    families: dict[str, float] = field(default_factory=dict)  # family -> accuracy


def default_candidates() -> list[BlendConfig]:
    """Methods x ratios swept by `ragkv calibrate` (cheapest first within a method)."""
    ratios = (0.05, 0.1, 0.15, 0.2, 0.3, 0.45)
    return [BlendConfig(recompute_ratio=r, method=m) for m in ("deviation", "gradual") for r in ratios]


def config_key(config: BlendConfig) -> str:
    """A stable name for a candidate: METHOD@RATIO plus any other non-default parameter."""
    defaults = asdict(BlendConfig())
    extra = [f"{k}={v}" for k, v in asdict(config).items()
             if k not in ("method", "recompute_ratio") and v != defaults[k]]
    return config.name + (f"[{','.join(extra)}]" if extra else "")


# -- measuring -------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    tokens: list[int]  # greedy answer
    compute_fraction: float
    kl: float  # mean KL(full || this) of next-token distributions, teacher-forced on full's answer


def _forced_rows(runner, cache: KVCache, first: torch.Tensor, answer: list[int], n: int) -> torch.Tensor:
    """[len(answer) + 1, vocab] fp32: `first` (the last prompt token's logits), then the logits after each
    answer token, teacher-forced over `cache` (which gets the answer's K/V appended)."""
    rows = [first.reshape(1, -1).float()]
    if answer:
        positions = torch.arange(n, n + len(answer), device=runner.device)
        rows.append(runner.forward(torch.tensor(answer, device=runner.device), positions, cache, last_only=False))
    return torch.cat(rows)


def _truncate(cache: KVCache, length: int) -> None:
    for layer in cache.layers:
        layer.keys, layer.values, layer.positions = (layer.keys[:, :length], layer.values[:, :length],
                                                     layer.positions[:length])


class _Prepared:
    """One prompt made ready: layout, stored prefix and chunk KV, full prefill's greedy answer and logits."""

    def __init__(self, runner, prompt: CalibrationPrompt, chunk_store, prefix_store,
                 chunk_form: str = DEFAULT_CHUNK_FORM):
        self.prompt = prompt
        chunks = [runner.tokenize(c) for c in prompt.chunks]
        self.layout = build_prompt(runner.tokenizer, prompt.system_prompt, chunks, prompt.question)
        self.prefix = prefix_store.as_stored(runner.chunk_kv(self.layout.prefix_ids))[1]
        self.kvs = [chunk_store.as_stored(compute_chunk(runner, c, chunk_form))[1] for c in chunks]
        self.chunk_form = chunk_form
        n = self.layout.num_tokens
        prefilled = run_prefill(runner, self.layout, plan_for("full", BlendConfig()))
        cache, first = prefilled.cache, prefilled.logits
        self.full = list(decode(runner, cache, first, n, SamplingParams(max_new_tokens=prompt.max_new_tokens)))
        _truncate(cache, n)
        self.full_rows = torch.log_softmax(_forced_rows(runner, cache, first, self.full, n), dim=-1)

    def run(self, runner, config: BlendConfig, reuse: bool = False) -> Outcome:
        """Blend (or reuse) on this prompt: greedy answer, compute fraction, KL against full.

        Greedy decoding, done the cheap way: one teacher-forced pass over full's answer finds the
        first step where this cache's argmax leaves it; only from there on is it decoded token by token."""
        plan = plan_for("reuse" if reuse else "blend", config)
        out = run_prefill(runner, self.layout, plan, HeldChunks(self.prefix, self.kvs), self.chunk_form)
        cache, first, cost = out.cache, out.logits, out.stats.compute_fraction
        n, full = self.layout.num_tokens, self.full
        rows = _forced_rows(runner, cache, first, full, n)  # row i predicts answer token i
        logp = torch.log_softmax(rows, dim=-1)
        kl = float((self.full_rows.exp() * (self.full_rows - logp)).sum(dim=-1).mean())
        steps = rows.argmax(dim=-1).tolist()
        diverge = next((i for i, (a, b) in enumerate(zip(steps, full)) if a != b), len(full))
        if diverge == len(full) and (len(full) == self.prompt.max_new_tokens or steps[-1] in runner.stop_token_ids):
            return Outcome(list(full), cost, kl)
        _truncate(cache, n + diverge)  # back to the prompt plus the agreeing part of the answer
        params = SamplingParams(max_new_tokens=self.prompt.max_new_tokens - diverge)
        tail = list(decode(runner, cache, rows[diverge], n + diverge, params))
        return Outcome(list(full[:diverge]) + tail, cost, kl)


def _score(rows: list[tuple[str, bool, bool, float, float]]) -> Score:
    """rows: (family, correct, agrees, compute_fraction, kl)."""
    n = len(rows)
    families: dict[str, list[bool]] = {}
    for family, correct, *_ in rows:
        families.setdefault(family, []).append(correct)
    return Score(accuracy=sum(r[1] for r in rows) / n, agreement=sum(r[2] for r in rows) / n,
                 compute_fraction=sum(r[3] for r in rows) / n, kl=sum(r[4] for r in rows) / n,
                 families={f: sum(v) / len(v) for f, v in sorted(families.items())})


@torch.inference_mode()
def evaluate(runner, prompts: Sequence[CalibrationPrompt], configs: Sequence[BlendConfig], codec: str,
             progress: Callable[[str], None] | None = None,
             chunk_form: str = DEFAULT_CHUNK_FORM) -> dict[str, Score]:
    """Scores of `full`, `reuse` and every config (by `config_key`) on `prompts`, codec round trip included;
    chunks computed in `chunk_form` (workers/chunk_forms.py), as the engine stores them."""
    from kvstore.store import BlockStore

    chunk_store = BlockStore(None, codec_for_model(codec, runner), runner.fingerprint)
    prefix_store = BlockStore(None, PREFIX_CODEC, runner.fingerprint)
    names = ["full", "reuse"] + [config_key(c) for c in configs]
    rows: dict[str, list] = {name: [] for name in names}
    for i, prompt in enumerate(prompts):
        prepared = _Prepared(runner, prompt, chunk_store, prefix_store, chunk_form)
        full_text = runner.detokenize(prepared.full)
        rows["full"].append((prompt.family, prompt.correct(full_text), True, 1.0, 0.0))
        runs = [("reuse", BlendConfig(), True)] + [(config_key(c), c, False) for c in configs]
        for name, config, reuse in runs:
            out = prepared.run(runner, config, reuse=reuse)
            rows[name].append((prompt.family, prompt.correct(runner.detokenize(out.tokens)), out.tokens == prepared.full,
                               out.compute_fraction, out.kl))
        if progress is not None:
            progress(f"prompt {i + 1}/{len(prompts)} ({prompt.family})")
    return {name: _score(r) for name, r in rows.items()}


# -- choosing --------------------------------------------------------------------


def _at_least_reuse(score: Score, reuse: Score) -> bool:
    """No family answered worse than plain reuse."""
    return all(score.families.get(f, 0.0) >= acc for f, acc in reuse.families.items())


def meets(score: Score, full: Score, reuse: Score, target: Target) -> bool:
    return (score.agreement >= target.min_agreement and score.accuracy >= full.accuracy - target.max_accuracy_drop
            and _at_least_reuse(score, reuse))


def choose(scores: dict[str, Score], target: Target) -> tuple[str, bool]:
    """-> (candidate key, target met). Cheapest that meets the target within max_compute; else the best
    trade-off within max_compute (no family below reuse, highest agreement, accuracy, lowest KL, cheapest)."""
    full, reuse = scores["full"], scores["reuse"]
    candidates = {k: s for k, s in scores.items() if k not in ("full", "reuse")}
    if not candidates:
        raise ValueError("no candidates to choose from")
    useful = {k: s for k, s in candidates.items() if s.compute_fraction <= target.max_compute} or candidates
    good = sorted((s.compute_fraction, -s.agreement, k) for k, s in useful.items() if meets(s, full, reuse, target))
    if good:
        return good[0][2], True
    # never worse than reuse if any candidate can help it: those first, then agreement, accuracy, KL, cost
    best = sorted((not _at_least_reuse(s, reuse), -s.agreement, -s.accuracy, s.kl, s.compute_fraction, k)
                  for k, s in useful.items())
    return best[0][-1], False


# -- storing ---------------------------------------------------------------------


def calibration_path(runner, codec: str, namespace: str = "") -> Path:
    """The model's record for `codec` (and `namespace`: `ragkv calibrate --requests --namespace`)."""
    space = f"-ns-{hashlib.sha256(namespace.encode()).hexdigest()[:12]}" if namespace else ""
    return beside_model(runner, f"ragkv-calibration-{codec}{space}.json", "calibration")


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _prompts_digest(prompts: Sequence[CalibrationPrompt]) -> str:
    return digest([[p.family, p.system_prompt, list(p.chunks), p.question, p.max_new_tokens] for p in prompts])


def load_calibration(runner, codec: str, path: Path | None = None,
                     chunk_form: str = DEFAULT_CHUNK_FORM, namespace: str = "") -> dict | None:
    """The stored record for this model, codec, chunk form (and namespace), or None (absent, unreadable,
    other model)."""
    path = path or calibration_path(runner, codec, namespace)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("version") != CALIBRATION_VERSION or record.get("fingerprint") != runner.fingerprint:
        return None
    if record.get("inputs", {}).get("chunk_form") != chunk_form:
        return None
    return record


def calibrated_config(record: dict) -> BlendConfig:
    return BlendConfig(**record["chosen"])


def calibrate(runner, prompts: Sequence[CalibrationPrompt], codec: str, candidates: Sequence[BlendConfig] | None = None,
              target: Target = Target(), force: bool = False, split: str = "dev",
              progress: Callable[[str], None] | None = None, path: Path | None = None,
              chunk_form: str = DEFAULT_CHUNK_FORM) -> dict:
    """Measure, choose and store (at `path`, default `calibration_path`); a stored record for the same
    inputs is returned as is unless `force`."""
    candidates = list(candidates or default_candidates())
    inputs = {"codec": codec, "target": asdict(target), "split": split, "prompts": _prompts_digest(prompts),
              "candidates": digest([asdict(c) for c in candidates]), "chunk_form": chunk_form}
    path = path or calibration_path(runner, codec)
    stored = load_calibration(runner, codec, path, chunk_form)
    if stored is not None and stored.get("inputs") == inputs and not force:
        return {**stored, "reused": True}
    scores = evaluate(runner, prompts, candidates, codec, progress=progress, chunk_form=chunk_form)
    key, met = choose(scores, target)
    chosen = next(c for c in candidates if config_key(c) == key)
    full = scores["full"]
    note = (f"{key} meets the target" if met else
            f"no candidate meets agreement >= {target.min_agreement} and accuracy within "
            f"{target.max_accuracy_drop:g} of full ({full.accuracy:.3f}) at compute <= {target.max_compute}; "
            f"{key} is the best trade-off")
    record = {"version": CALIBRATION_VERSION, "fingerprint": runner.fingerprint, "inputs": inputs,
              "num_prompts": len(prompts), "chosen": asdict(chosen), "chosen_key": key, "target_met": met,
              "note": note, "scores": {k: asdict(s) for k, s in scores.items()}}
    write_record(path, record)
    return {**record, "reused": False}
