"""One peft-wrapped copy of the model for the lora tests: a rank-4 adapter and the same adapter with B = 0."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def adapters(runner):
    from workers.lora import random_adapter

    adapter = random_adapter(runner, rank=4, seed=7)
    return adapter, adapter.zeroed_b()


@pytest.fixture(scope="module")
def models(runner, adapters):
    from workers.lora import AdapterModels

    return AdapterModels(runner, list(adapters))


@pytest.fixture(scope="module")
def chunk_ids(runner):
    return runner.tokenize("The city was founded in 1432 by the salt merchant Osric Vale.")
