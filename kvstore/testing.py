"""Throwaway redis-servers on free loopback ports, for tests and benchmarks.

    with RedisServer() as server:
        backend = open_backend(server.url)
    with RedisCluster(primaries=3, replicas=1) as cluster:  # 6 cluster-enabled redis-servers
        backend = open_backend(cluster.url)                  # redis+cluster://127.0.0.1:P1,...
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Throwaway:
    """Started on enter; on exit killed and its temp dir (made unless `workdir` is given) removed."""

    def __init__(self, workdir: str | Path | None, prefix: str):
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix=prefix)
        self.workdir = Path(workdir if workdir is not None else self._tmp.name)

    def start(self):
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RedisServer(_Throwaway):
    """redis-server with its own data dir; started on enter, killed on exit.

    `persist=True` turns on an fsync-always append-only file, so data outlives a SIGKILL
    (`kill()`, then `start()` again on the same port); `password` sets requirepass.
    """

    def __init__(self, workdir: str | Path | None = None, port: int | None = None, password: str | None = None,
                 persist: bool = False, args: tuple[str, ...] = ()):
        super().__init__(workdir, "ragkv-redis-")
        self.port = port or free_port()
        self.password = password
        self.persist = persist
        self.args = tuple(args)  # extra redis-server options, e.g. ("--cluster-enabled", "yes")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run `make setup`")
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.workdir)]
        argv += ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        argv += self.args
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        """SIGKILL, keeping the data dir: `start()` brings it back on the same port."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def _cli(*args: str, timeout: float = 60.0) -> str:
    exe = shutil.which("redis-cli")
    if exe is None:
        raise RuntimeError("redis-cli is not installed: run `make setup`")
    out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(args[:2])} failed: {(out.stdout + out.stderr)[-2000:]}")
    return out.stdout


class RedisCluster(_Throwaway):
    """A Redis Cluster of `primaries` x (1 + `replicas`) cluster-enabled redis-servers on loopback.

    Three or more primaries are joined with `redis-cli --cluster create --cluster-replicas N`; a single
    primary (no replicas) takes all 16384 slots with CLUSTER ADDSLOTSRANGE. Every node has its own data
    dir under one temp dir, a free port and a free cluster-bus port; `start()` returns once every node
    reports cluster_state:ok and every replica is in sync (bounded waits), and `stop()` kills every
    process however far start got. `cluster-require-full-coverage no`: a dead primary's slots miss, the
    rest keep serving; `cluster-replica-validity-factor 0`: a replica always may take over.
    """

    def __init__(self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 2000,
                 workdir: str | Path | None = None):
        if primaries < 3 and not (primaries == 1 and replicas == 0):
            raise ValueError("a cluster needs 3+ primaries (redis-cli --cluster create), or 1 primary alone")
        self.primaries, self.replicas, self.node_timeout_ms = primaries, replicas, node_timeout_ms
        super().__init__(workdir, "ragkv-cluster-")
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def _node(self, i: int) -> RedisServer:
        d = self.workdir / f"node{i}"
        args = ("--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-port", str(free_port()), "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-require-full-coverage", "no", "--cluster-replica-validity-factor", "0",
                "--repl-diskless-sync-delay", "0", "--logfile", str(d / "redis.log"))
        return RedisServer(d, args=args)

    def start(self, timeout: float = 60.0) -> "RedisCluster":
        deadline = time.monotonic() + timeout
        try:
            for i in range(self.primaries * (1 + self.replicas)):
                self.nodes.append(self._start_node(i))
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            if self.primaries == 1:
                self.client(self.nodes[0]).execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            else:
                _cli("--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas), "--cluster-yes",
                     timeout=max(1.0, deadline - time.monotonic()))
            self.wait_ok(deadline - time.monotonic())
            return self
        except BaseException:
            self.stop()
            raise

    def _start_node(self, i: int, tries: int = 3) -> RedisServer:
        """A free port can be taken between the check and the bind: retry on fresh ports."""
        for attempt in range(tries):
            node = self._node(i)
            try:
                node.start()
                self.client(node).ping()
                return node
            except Exception:
                node.kill()
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def client(node: RedisServer):
        import redis

        return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5, socket_connect_timeout=2)

    def live_nodes(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node sees cluster_state:ok, all live nodes, and each live replica is synced."""
        deadline = time.monotonic() + timeout
        problem = "not checked"
        while time.monotonic() < deadline:
            problem = self._not_ok()
            if problem is None:
                return
            time.sleep(0.1)
        raise TimeoutError(f"redis cluster not ready after {timeout:.0f}s: {problem}")

    def _not_ok(self) -> str | None:
        live = self.live_nodes()
        roles = {}
        for node in live:
            try:
                c = self.client(node)
                info = c.cluster("info")
                repl = c.info("replication")
            except Exception as e:
                return f"node {node.port}: {type(e).__name__}"
            if info["cluster_state"] != "ok":
                return f"node {node.port}: cluster_state {info['cluster_state']}"
            if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                return f"replica {node.port}: master link {repl.get('master_link_status')}"
            roles[node.port] = repl["role"]
        if list(roles.values()).count("master") != self.primaries:
            return f"roles {roles}"
        for node in live:  # gossip converged: every node sees every live node in its real role
            if self._view(node) != roles:
                return f"node {node.port} sees {self._view(node)}, roles are {roles}"
        return None

    def _view(self, node: RedisServer) -> dict[int, str]:
        """port -> "master" | "slave" of the live, not failed nodes, as `node`'s CLUSTER NODES says."""
        live = {n.port for n in self.live_nodes()}
        lines = self.client(node).execute_command("CLUSTER", "NODES")
        out = {}
        for line in (lines.decode() if isinstance(lines, bytes) else lines).splitlines():
            fields = line.split()
            port, flags = int(fields[1].split("@")[0].rsplit(":", 1)[1]), fields[2]
            if port in live and "fail" not in flags:
                out[port] = "master" if "master" in flags else "slave"
        return out

    def roles(self) -> dict[int, str]:
        """port -> "master" | "slave" of the live nodes (as each reports itself)."""
        return {n.port: self.client(n).info("replication")["role"] for n in self.live_nodes()}

    def primary_nodes(self) -> list[RedisServer]:
        roles = self.roles()
        return [n for n in self.live_nodes() if roles[n.port] == "master"]

    def node_for_slot(self, slot: int, seen_by: RedisServer | None = None) -> RedisServer:
        """The primary serving `slot`, as `seen_by` (default: the first live node) says."""
        ranges = self.client(seen_by or self.live_nodes()[0]).execute_command("CLUSTER", "SLOTS")
        for lo, hi, primary, *_ in ranges:
            if lo <= slot <= hi:
                return next(n for n in self.nodes if n.port == int(primary[1]))
        raise KeyError(f"slot {slot} is not served")

    def replicas_of(self, node: RedisServer) -> list[RedisServer]:
        return [n for n in self.live_nodes() if n is not node
                and self.client(n).info("replication").get("master_port") == node.port]

    def migrate_slot(self, slot: int, target: RedisServer, pause_s: float = 0.0, on_key=None,
                     timeout: float = 30.0) -> int:
        """Move `slot` to primary `target` the way a resharding does (SETSLOT IMPORTING/MIGRATING, MIGRATE
        key by key, SETSLOT NODE), sleeping `pause_s` and calling `on_key()` after each key, so clients
        see it half-moved; returns once every primary names `target` as the owner. Keys moved."""
        source = self.node_for_slot(slot)
        if source is target:
            return 0
        src, dst = self.client(source), self.client(target)
        src_id, dst_id = (c.execute_command("CLUSTER", "MYID") for c in (src, dst))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            if on_key is not None:
                on_key()
            time.sleep(pause_s)
        primaries = [target, source, *(n for n in self.primary_nodes() if n not in (target, source))]
        for node in primaries:
            self.client(node).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        deadline = time.monotonic() + timeout
        while any(self.node_for_slot(slot, seen_by=n) is not target for n in self.live_nodes()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"slot {slot} not owned by {target.port} everywhere after {timeout:.0f}s")
            time.sleep(0.05)
        return moved

    def flushall(self) -> None:
        for node in self.primary_nodes():
            self.client(node).flushall()

    def kill(self) -> None:
        """SIGKILL every node (`stop()` also removes the temp dir)."""
        for node in self.nodes:
            node.kill()
        self.nodes = []
