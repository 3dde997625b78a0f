"""A worker says which noise step it runs (market._step): the compiled one, or the numpy
reference it falls back to, which still serves the market (the same noise check)."""

from __future__ import annotations

import time

import pytest

from ..conftest import Market

pytestmark = [pytest.mark.broker]


def _line_in(market: Market, n: int, text: str, timeout: float = 60.0) -> str:
    """The first line of worker ``n``'s log holding ``text``, waited for."""
    path = market.tmp / f"worker{n}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if text in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in {path}:\n{path.read_text(errors='replace')[-3000:]}")


def test_a_worker_on_the_reference_step_starts_and_says_so(market: Market) -> None:
    market.start_worker_env({"EMARKET_NOISE_STEP": "numpy"})  # healthy: its identity matches
    line = _line_in(market, 0, "noise step:")
    assert "noise step: numpy reference (EMARKET_NOISE_STEP=numpy)" in line
    assert "WARNING" in line, line
