"""Engine request/result types: plain data, validated at construction, no torch import.

The gRPC layer converts messages to these and back; the engine works on these only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from workers.errors import InvalidArgument

CHUNK_ID_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_CHUNKS = 64
MAX_CHUNK_CHARS = 32_000
MAX_QUESTION_CHARS = 8_000
MAX_SYSTEM_PROMPT_CHARS = 8_000
MAX_NEW_TOKENS = 2048


def is_chunk_id(text: str) -> bool:
    return bool(CHUNK_ID_RE.match(text))


def known_mode(name: str) -> bool:
    from workers.modes import PREFILL_MODES

    return name in PREFILL_MODES


def mode_names() -> tuple[str, ...]:
    """Every registered prefill mode (workers.modes.PREFILL_MODES, imported when first needed)."""
    from workers.modes import PREFILL_MODES

    return tuple(PREFILL_MODES)


def policy_names() -> tuple[str, ...]:
    """"none" and every registered eviction policy (workers.eviction's registry, imported when first
    needed: it brings torch, which this module does not import at load time)."""
    from workers.eviction.policies import POLICIES as registry  # imports no request type at run time

    return ("none", *sorted(registry))


def _check_budget(name: str, budget) -> None:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
        raise InvalidArgument(name, f"must be a float in (0, 1] or a positive int, got {budget!r}")
    if isinstance(budget, float) and not 0.0 < budget <= 1.0:
        raise InvalidArgument(name, f"fraction must be in (0, 1], got {budget}")
    if isinstance(budget, int) and budget < 1:
        raise InvalidArgument(name, f"token count must be >= 1, got {budget}")


def _budget_tokens(budget: float | int, tokens: int) -> int:
    if isinstance(budget, float):
        return max(1, int(round(budget * tokens)))
    return int(budget)


@dataclass(frozen=True)
class CompressionSpec:
    policy: str = "none"
    budget: float | int = 1.0  # float in (0, 1]: fraction of prompt tokens kept; int >= 1: tokens kept
    sink_tokens: int = 4
    protect_system_prompt: bool = True
    window: int | None = None  # recent-window size for policies that keep one
    protected_spans: tuple[tuple[int, int], ...] = ()  # extra [start, end) token spans never evicted
    # bound on the cache while decoding (float: fraction of prompt tokens, int: tokens); None = the policy's
    # own semantics: prefill presses append generated tokens, decode-time methods keep `budget`
    decode_budget: float | int | None = None

    def __post_init__(self) -> None:
        names = policy_names()
        if self.policy not in names:
            raise InvalidArgument("compression.policy", f"unknown policy {self.policy!r}; expected one of {', '.join(names)}")
        _check_budget("compression.budget", self.budget)
        if self.decode_budget is not None:
            _check_budget("compression.decode_budget", self.decode_budget)
        if self.sink_tokens < 0:
            raise InvalidArgument("compression.sink_tokens", f"must be >= 0, got {self.sink_tokens}")
        if self.window is not None and self.window < 0:
            raise InvalidArgument("compression.window", f"must be >= 0, got {self.window}")

    def budget_tokens(self, prompt_tokens: int) -> int:
        return _budget_tokens(self.budget, prompt_tokens)

    def decode_budget_tokens(self, prompt_tokens: int) -> int | None:
        return None if self.decode_budget is None else _budget_tokens(self.decode_budget, prompt_tokens)

    def address_json(self) -> dict:
        """Every field that changes a chunk compressed with this spec (part of its content address)."""
        return {"policy": self.policy, "budget": self.budget, "budget_kind": type(self.budget).__name__,
                "sink_tokens": self.sink_tokens, "window": self.window}


CHAT_ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 256
MAX_MESSAGE_CHARS = 64_000
MAX_CONVERSATION_CHARS = 128_000  # all messages together


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant
    content: str


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation rendered by the model's chat template (or, `template=False`, one plain prompt).

    `documents` (chunk texts or stored chunk ids) go into the last user message before its text, as
    in the gRPC layout; `discover`: ingested chunks pasted into a user message are served from the
    store (workers/discovery.py)."""
    messages: tuple[ChatMessage, ...]
    documents: tuple[str, ...] = ()
    discover: bool = True
    template: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "documents", tuple(self.documents))
        if not self.messages:
            raise InvalidArgument("messages", "at least one message is required")
        if len(self.messages) > MAX_MESSAGES:
            raise InvalidArgument("messages", f"at most {MAX_MESSAGES} messages, got {len(self.messages)}")
        for i, m in enumerate(self.messages):
            if m.role not in CHAT_ROLES:
                raise InvalidArgument(f"messages[{i}].role", f"must be one of {', '.join(CHAT_ROLES)}, got {m.role!r}")
            if len(m.content) > MAX_MESSAGE_CHARS:
                raise InvalidArgument(f"messages[{i}].content", f"longer than {MAX_MESSAGE_CHARS} characters")
        if sum(len(m.content) for m in self.messages) > MAX_CONVERSATION_CHARS:
            raise InvalidArgument("messages", f"longer than {MAX_CONVERSATION_CHARS} characters in all")
        users = [m for m in self.messages if m.role == "user"]
        if not users:
            raise InvalidArgument("messages", "at least one user message is required")
        if not self.documents and not any(m.content.strip() for m in users):
            raise InvalidArgument("messages", "the user messages are empty")
        check_chunk_texts("documents", self.documents)


@dataclass(frozen=True)
class GenerateRequest:
    question: str
    chunks: tuple[str, ...]  # chunk texts, or content ids (64 hex chars) of stored chunks
    system_prompt: str = ""
    max_new_tokens: int = 64
    mode: str = "blend"
    recompute_ratio: float | None = None  # None = the server's setting (calibrated for the model when stored)
    compression: CompressionSpec | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    namespace: str = ""
    chat: ChatPrompt | None = None  # an OpenAI-style prompt instead of question + chunks (workers/chat_prompt.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(self.chunks))
        if self.chat is None:
            self._check_question_and_chunks()
        self._check_settings()

    def _check_question_and_chunks(self) -> None:
        if not self.question or not self.question.strip():
            raise InvalidArgument("question", "must not be empty")
        if len(self.question) > MAX_QUESTION_CHARS:
            raise InvalidArgument("question", f"longer than {MAX_QUESTION_CHARS} characters")
        if not self.chunks:
            raise InvalidArgument("chunks", "at least one chunk is required")
        check_chunk_texts("chunks", self.chunks)

    def _check_settings(self) -> None:
        if len(self.system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
            raise InvalidArgument("system_prompt", f"longer than {MAX_SYSTEM_PROMPT_CHARS} characters")
        if not known_mode(self.mode):  # a registry lookup: a plug-in's mode (research/) counts when installed
            raise InvalidArgument("mode", f"unknown mode {self.mode!r}; expected one of {', '.join(mode_names())}")
        if self.recompute_ratio is not None and not (
                isinstance(self.recompute_ratio, (int, float)) and 0.0 <= self.recompute_ratio <= 1.0):
            raise InvalidArgument("recompute_ratio", f"must be in [0, 1], got {self.recompute_ratio}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise InvalidArgument("max_new_tokens", f"must be in [1, {MAX_NEW_TOKENS}], got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 10.0):
            raise InvalidArgument("temperature", f"must be in [0, 10], got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise InvalidArgument("top_p", f"must be in (0, 1], got {self.top_p}")
        check_namespace(self.namespace)


def check_chunk_texts(field_name: str, texts: tuple[str, ...]) -> None:
    """A request's chunk texts (or ids), `chunks` or `documents`: at most MAX_CHUNKS, each non-empty and short."""
    if len(texts) > MAX_CHUNKS:
        raise InvalidArgument(field_name, f"at most {MAX_CHUNKS} {field_name} per request, got {len(texts)}")
    for i, text in enumerate(texts):
        if not text or not text.strip():
            raise InvalidArgument(f"{field_name}[{i}]", "must not be empty")
        if len(text) > MAX_CHUNK_CHARS:
            raise InvalidArgument(f"{field_name}[{i}]", f"longer than {MAX_CHUNK_CHARS} characters")


MAX_NAMESPACE_CHARS = 128


def check_namespace(namespace: str) -> str:
    """Printable and short: control characters are reserved (the engine's own prefix blocks use one)."""
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise InvalidArgument("namespace", f"longer than {MAX_NAMESPACE_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in namespace):
        raise InvalidArgument("namespace", "must not contain control characters")
    return namespace


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
    ttft_s: float
    total_s: float
    stats: dict = field(default_factory=dict)  # chunks_hit, chunks_computed, recomputed_tokens, prompt_tokens, kv_bytes_loaded, ...
