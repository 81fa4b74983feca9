"""Run `ragkv serve` in a subprocess for end-to-end tests; make a self-signed TLS certificate."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvstore.testing import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "ragkv listening on "


class ServerProcess:
    """`python -m ragkv.cli serve ...` on a free loopback port with its own disk store."""

    def __init__(self, workdir: Path, *extra: str, metrics: bool = False):
        self.workdir = workdir
        self.port = free_port()
        self.metrics_port = free_port() if metrics else None
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.stdout_lines: list[str] = []
        self._ready = threading.Event()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "server.stderr"

    def stderr_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        argv = [sys.executable, "-m", "ragkv.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--store", f"disk:{self.workdir / 'store'}", *self.extra]
        if self.metrics_port is not None:
            argv += ["--metrics-port", str(self.metrics_port)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=open(self.stderr_path, "wb"), text=True)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ragkv serve did not start (rc={self.proc.returncode}):\n{self.stderr_tail()}")
        return self

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.stdout_lines.append(line.rstrip("\n"))
            if line.startswith(READY_PREFIX):
                self._ready.set()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful drain) and wait; returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def self_signed_cert(workdir: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) for CN=localhost with SANs localhost and 127.0.0.1; also usable as a root."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = workdir / "cert.pem", workdir / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
