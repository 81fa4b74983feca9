"""SDK data types (plain dataclasses; no grpc, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc


@dataclass(frozen=True)
class Compression:
    """Token-level KV eviction. `budget`: a float in (0, 1] keeps that fraction of the prompt's
    tokens, an int keeps that many. Protected tokens (sinks, system prompt) are never evicted.

    `decode_budget` (same forms) bounds the cache while decoding; None = the policy's own semantics
    (prefill presses such as snapkv / kvzip append generated tokens; streaming / h2o / tova keep `budget`).
    Passed to `ingest(..., compression=...)` with a query-agnostic policy (kvzip), chunks are stored
    already compressed."""

    policy: str
    budget: float | int = 1.0
    sink_tokens: int = 4
    protect_system_prompt: bool = True
    window: int | None = None
    decode_budget: float | int | None = None

    def __post_init__(self) -> None:
        for name in ("budget", "decode_budget"):
            value = getattr(self, name)
            if name == "decode_budget" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a float fraction or an int token count, got {value!r}")


@dataclass(frozen=True)
class ChunkRef:
    id: str  # content address, hex
    num_tokens: int
    cached: bool  # was already stored


@dataclass
class GenerateResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    ttft_s: float  # server-side time to first token
    total_s: float
    stats: dict = field(default_factory=dict)  # chunks_hit, chunks_computed, recomputed_tokens, prompt_tokens, kv_bytes_loaded, ...


class RagKVError(Exception):
    """Every error the server returns: `code` is the grpc.StatusCode, `message` says what was wrong."""

    def __init__(self, code: grpc.StatusCode, message: str, request_id: str | None = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id

    @classmethod
    def from_rpc_error(cls, e: grpc.RpcError) -> "RagKVError":
        code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
        details = e.details() if callable(getattr(e, "details", None)) else str(e)
        rid = None
        try:
            rid = dict(e.initial_metadata() or ()).get("x-request-id")
        except Exception:  # not every RpcError carries metadata (e.g. a failed connection)
            pass
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", rid)
