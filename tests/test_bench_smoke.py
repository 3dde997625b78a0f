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
