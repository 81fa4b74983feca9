"""Regenerate the committed gRPC stubs from proto/.

    python -m ragkv.tools.gen_proto [--out DIR]

Writes ragkv/v1/ragkv_pb2.py, ragkv_pb2_grpc.py and ragkv_pb2.pyi under DIR
(default: the repository root) with grpc_tools.protoc and `-Iproto`, so the
generated imports read `from ragkv.v1 import ragkv_pb2`. tests/server/test_proto.py
regenerates into a temp dir and diffs against the committed files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_FILES = ("ragkv/v1/ragkv.proto",)
GENERATED = ("ragkv/v1/ragkv_pb2.py", "ragkv/v1/ragkv_pb2_grpc.py", "ragkv/v1/ragkv_pb2.pyi")


def generate(out: Path) -> list[Path]:
    """Run protoc into `out`; returns the generated files. Raises RuntimeError on failure."""
    import grpc_tools
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *(str(PROTO_ROOT / name) for name in PROTO_FILES),
    ]
    if protoc.main(argv) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(argv)}")
    return [out / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragkv.tools.gen_proto", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: the repository root)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
