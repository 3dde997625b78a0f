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
    assert "market ingest: >= 0.7x pass-through: " in out  # a goal per path, with its ratio


@pytest.mark.slow
def test_report_regenerates(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.report", "--quick", "--no-service", "--out", str(tmp_path)],
        check=True, capture_output=True, text=True, timeout=600,
    ).stdout  # fmt: skip
    assert "10 figures" in out
    from pathlib import Path

    report = (Path(str(tmp_path)) / "report.md").read_text()
    for section in ("Accuracy after k relaxation steps", "Sample paths", "Sparse histograms",
                    "Exact counts: discrete Laplace", "Running totals",
                    "RAPPOR", "social network", "Speed of the samplers"):  # fmt: skip
        assert section in report
