"""Fixtures for gateway tests: fake engines on loopback, and a plan written for them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import Engine, engine


@pytest.fixture(scope="module")
def engine_a() -> Iterator[Engine]:
    with engine("a", "127.0.0.2") as e:
        yield e


@pytest.fixture(scope="module")
def engine_b() -> Iterator[Engine]:
    with engine("b", "127.0.0.3") as e:
        yield e


@pytest.fixture(scope="module")
def engine_failing() -> Iterator[Engine]:
    """Healthy by its /health, but answers every API request with 500."""
    with engine("failing", "127.0.0.4", "--fail-status", "500") as e:
        yield e
