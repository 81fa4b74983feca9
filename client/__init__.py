"""ragkv Python SDK: RagKVClient (blocking) and AsyncRagKVClient (asyncio). Imports no torch."""

from client._channel import Retry
from client.aio import AsyncGenerateStream, AsyncRagKVClient
from client.sync import GenerateStream, RagKVClient
from client.types import ChunkRef, Compression, GenerateResult, RagKVError

__all__ = ["RagKVClient", "AsyncRagKVClient", "GenerateStream", "AsyncGenerateStream", "Compression", "ChunkRef",
           "GenerateResult", "RagKVError", "Retry"]
