from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.bench import harness
from tests.conftest import js, nats_server, nc  # noqa: F401  (the real-server fixtures)


@pytest.fixture(scope="session", autouse=True)
def bench_table() -> Iterator[None]:
    yield
    if harness.figures:
        harness.write()
        print("\n\nHealthplane benchmarks (ratios are against a baseline measured in the same run)\n")
        print(harness.table())
        print(f"\nwritten to {harness.RESULTS}")
