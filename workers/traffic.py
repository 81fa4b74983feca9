"""Calibration on the user's own traffic, without labels (`ragkv calibrate --requests FILE`).

For each candidate ratio (the server's selection method), the share of the given requests whose
greedy blended answer is full prefill's answer, token for token; the smallest ratio that reaches the
target agreement (default 0.9) is stored for this model, codec and namespace, and `ragkv serve` uses it
for that namespace's requests that give no ratio. The curve is kept in the record; when no ratio
reaches the target, the best one is stored with `target_met: false`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from workers.blend import BlendConfig
from workers.calibration import CALIBRATION_VERSION, calibration_path, config_key, digest, evaluate
from workers.chunk_forms import DEFAULT_CHUNK_FORM
from workers.errors import InvalidArgument
from workers.model import write_record

RATIOS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7)
TARGET_AGREEMENT = 0.9
MAX_REQUESTS = 1000


@dataclass(frozen=True)
class TrafficRequest:
    """One logged request: what a blend would be asked. Agreement with full needs no gold answer."""

    question: str
    chunks: tuple[str, ...]
    system_prompt: str = ""
    max_new_tokens: int = 24
    family: str = "traffic"

    def correct(self, text: str) -> bool:  # unlabeled: accuracy is not measured here
        return False


def read_requests(path: Path) -> list[TrafficRequest]:
    """JSONL of {"question", "chunks", "system_prompt"?, "max_new_tokens"?}; InvalidArgument names the line."""
    requests = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            request = TrafficRequest(str(item["question"]), tuple(str(c) for c in item["chunks"]),
                                     str(item.get("system_prompt", "")), int(item.get("max_new_tokens", 24)))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument("requests", f"line {number}: expected a JSON object with question and chunks "
                                              f"({exc.__class__.__name__}: {exc})") from None
        if not request.question.strip() or not request.chunks or not 1 <= request.max_new_tokens <= 256:
            raise InvalidArgument("requests", f"line {number}: empty question or chunks, or max_new_tokens "
                                              "outside [1, 256]")
        requests.append(request)
    if not requests or len(requests) > MAX_REQUESTS:
        raise InvalidArgument("requests", f"expected 1 to {MAX_REQUESTS} requests, got {len(requests)}")
    return requests


def calibrate_traffic(runner, requests: Sequence[TrafficRequest], codec: str, ratios: Sequence[float] = RATIOS,
                      target: float = TARGET_AGREEMENT, namespace: str = "", setting: BlendConfig = BlendConfig(),
                      path: Path | None = None, progress: Callable[[str], None] | None = None,
                      chunk_form: str = DEFAULT_CHUNK_FORM) -> dict:
    """Measure the agreement curve, choose the smallest ratio at `target`, store it (see the module doc)."""
    candidates = [setting.with_ratio(r) for r in sorted(set(ratios))]
    scores = evaluate(runner, requests, candidates, codec, progress=progress, chunk_form=chunk_form)
    curve = {f"{c.recompute_ratio:g}": scores[config_key(c)].agreement for c in candidates}
    met = [c for c in candidates if scores[config_key(c)].agreement >= target]
    chosen = met[0] if met else max(candidates, key=lambda c: (scores[config_key(c)].agreement, -c.recompute_ratio))
    inputs = {"codec": codec, "namespace": namespace, "kind": "traffic", "target_agreement": target,
              "requests": digest([asdict(r) for r in requests]), "chunk_form": chunk_form}
    record = {"version": CALIBRATION_VERSION, "fingerprint": runner.fingerprint, "inputs": inputs,
              "num_prompts": len(requests), "chosen": asdict(chosen), "chosen_key": config_key(chosen),
              "target_met": bool(met), "agreement_curve": curve,
              "reuse_agreement": scores["reuse"].agreement,
              "note": (f"ratio {chosen.recompute_ratio:g} is the smallest with agreement >= {target:g}" if met else
                       f"no ratio reaches agreement {target:g}; {chosen.recompute_ratio:g} agrees most"),
              "scores": {k: asdict(v) for k, v in scores.items()}}
    path = path or calibration_path(runner, codec, namespace)
    write_record(path, record)
    return record
