"""Engine, RayEngine and the metrics wrapper declare one interface (workers/protocol.py) and keep to it."""

from __future__ import annotations

import inspect

import pytest

from ragkv.server.metrics import Instrumented, Metrics
from workers.engine import Engine
from workers.protocol import ENGINE_METHODS, EngineProtocol
from workers.ray_pool import RayEngine

IMPLEMENTATIONS = [Engine, RayEngine]


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_protocol_lists_every_method():
    declared = {n for n, v in vars(EngineProtocol).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert declared == set(ENGINE_METHODS)


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_same_methods_same_parameters(cls):
    """Congruence: every implementation takes the protocol's parameters, with the same names and defaults."""
    for name in ENGINE_METHODS:
        assert _params(getattr(cls, name)) == _params(getattr(EngineProtocol, name)), f"{cls.__name__}.{name}"


def test_metrics_wrapper_is_an_engine():
    class Fake:
        max_batch = 1

        def __getattr__(self, name):
            if name in ENGINE_METHODS:
                return lambda *a, **k: None
            raise AttributeError(name)

    assert isinstance(Instrumented(Fake(), Metrics()), EngineProtocol)
    assert not isinstance(object(), EngineProtocol)
