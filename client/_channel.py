"""Channel options, credentials, call metadata and the retry schedule shared by both clients."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc

MAX_MESSAGE_BYTES = 64 << 20


@dataclass(frozen=True)
class Retry:
    """Exponential backoff with full jitter, for UNAVAILABLE on idempotent calls only."""

    attempts: int = 4  # total tries
    initial_s: float = 0.1
    multiplier: float = 2.0
    max_s: float = 2.0

    def delays(self) -> Iterator[float]:
        delay = self.initial_s
        for _ in range(self.attempts - 1):
            yield random.uniform(0, delay)
            delay = min(delay * self.multiplier, self.max_s)


RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


def options(extra: list[tuple[str, object]] | None = None) -> list[tuple[str, object]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *(extra or [])]


def credentials(tls: bool, root_certificates: bytes | str | Path | None) -> grpc.ChannelCredentials | None:
    """None for plaintext; TLS when `tls` or a root certificate (PEM bytes or a file path) is given."""
    if root_certificates is None and not tls:
        return None
    if isinstance(root_certificates, (str, Path)):
        root_certificates = Path(root_certificates).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=root_certificates)


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
