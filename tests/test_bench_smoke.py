"""The benchmark scripts still run (a smoke test, not a timed test: numbers are not checked)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_noise_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.noise", "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "| laplace | relax |" in out
    assert "## Memory per stored value" in out


@pytest.mark.slow
@pytest.mark.broker
def test_service_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.service", "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    for row in ("raw aiokafka round trip", "Faust pass-through agent", "market ingest",
                "market purchase"):  # fmt: skip
        assert f"| {row}" in out
