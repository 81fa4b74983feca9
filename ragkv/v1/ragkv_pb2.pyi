from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkRef(_message.Message):
    __slots__ = ("id", "num_tokens", "cached")
    ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    id: str
    num_tokens: int
    cached: bool
    def __init__(self, id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., cached: _Optional[bool] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("texts", "pin", "namespace", "compression")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    pin: bool
    namespace: str
    compression: Compression
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., pin: _Optional[bool] = ..., namespace: _Optional[str] = ..., compression: _Optional[_Union[Compression, _Mapping]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkRef]
    def __init__(self, chunks: _Optional[_Iterable[_Union[ChunkRef, _Mapping]]] = ...) -> None: ...

class Compression(_message.Message):
    __slots__ = ("policy", "budget_fraction", "budget_tokens", "sink_tokens", "protect_system_prompt", "window", "decode_budget_fraction", "decode_budget_tokens")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FRACTION_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SINK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROTECT_SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    DECODE_BUDGET_FRACTION_FIELD_NUMBER: _ClassVar[int]
    DECODE_BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    budget_fraction: float
    budget_tokens: int
    sink_tokens: int
    protect_system_prompt: bool
    window: int
    decode_budget_fraction: float
    decode_budget_tokens: int
    def __init__(self, policy: _Optional[str] = ..., budget_fraction: _Optional[float] = ..., budget_tokens: _Optional[int] = ..., sink_tokens: _Optional[int] = ..., protect_system_prompt: _Optional[bool] = ..., window: _Optional[int] = ..., decode_budget_fraction: _Optional[float] = ..., decode_budget_tokens: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("question", "chunks", "system_prompt", "max_new_tokens", "mode", "recompute_ratio", "compression", "temperature", "top_p", "seed", "namespace")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_RATIO_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    question: str
    chunks: _containers.RepeatedScalarFieldContainer[str]
    system_prompt: str
    max_new_tokens: int
    mode: str
    recompute_ratio: float
    compression: Compression
    temperature: float
    top_p: float
    seed: int
    namespace: str
    def __init__(self, question: _Optional[str] = ..., chunks: _Optional[_Iterable[str]] = ..., system_prompt: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., mode: _Optional[str] = ..., recompute_ratio: _Optional[float] = ..., compression: _Optional[_Union[Compression, _Mapping]] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., namespace: _Optional[str] = ...) -> None: ...

class GenerateStats(_message.Message):
    __slots__ = ("chunks_hit", "chunks_computed", "recomputed_tokens", "prompt_tokens", "kv_bytes_loaded", "extra_json")
    CHUNKS_HIT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_LOADED_FIELD_NUMBER: _ClassVar[int]
    EXTRA_JSON_FIELD_NUMBER: _ClassVar[int]
    chunks_hit: int
    chunks_computed: int
    recomputed_tokens: int
    prompt_tokens: int
    kv_bytes_loaded: int
    extra_json: str
    def __init__(self, chunks_hit: _Optional[int] = ..., chunks_computed: _Optional[int] = ..., recomputed_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., kv_bytes_loaded: _Optional[int] = ..., extra_json: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "prompt_token_ids", "ttft_s", "total_s", "stats")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ttft_s: float
    total_s: float
    stats: GenerateStats
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., ttft_s: _Optional[float] = ..., total_s: _Optional[float] = ..., stats: _Optional[_Union[GenerateStats, _Mapping]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("text", "result")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    text: str
    result: GenerateResponse
    def __init__(self, text: _Optional[str] = ..., result: _Optional[_Union[GenerateResponse, _Mapping]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("ids", "namespace")
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, present: _Optional[_Iterable[bool]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("ids", "namespace")
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ("ids", "namespace")
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ...) -> None: ...

class UnpinResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("ids", "namespace")
    IDS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerStats(_message.Message):
    __slots__ = ("version", "uptime_s", "in_flight", "queued", "max_queue")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    version: str
    uptime_s: float
    in_flight: int
    queued: int
    max_queue: int
    def __init__(self, version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., max_queue: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("server", "engine_json")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_JSON_FIELD_NUMBER: _ClassVar[int]
    server: ServerStats
    engine_json: str
    def __init__(self, server: _Optional[_Union[ServerStats, _Mapping]] = ..., engine_json: _Optional[str] = ...) -> None: ...
