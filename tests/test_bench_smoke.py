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
    for row in (
        "top of 4 steps vs SparseHistogramRelease, 4 rounds",
        "the same, plus building the stream's survival law",
        "vs a Gaussian vector of as many numbers",
        "domain 2^60 vs 2^20",
    ):
        assert f"| histogram | {row} |" in out
    assert "## Memory per stored value" in out


def test_core_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.core", "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for row in ("purchase (next step, 4 values, sealed, receipt)", "value (8 numbers, 2 holders)"):
        assert f"| {row} |" in out
    assert "| core CPU µs/event | crypto floor CPU µs | core / floor |" in out
    assert out.count("| <= 2x: ") == 2  # a goal per path
    assert "\nmachine: " in out and "SIMD " in out


@pytest.mark.slow
def test_state_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.state", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "| chain state | 3,300 |" in out and "One checkpoint per partition" in out


def test_trace_counts_the_same_path_twice() -> None:
    """``bench.trace`` runs, finds both paths in the core, and its warm-up reaches the steady
    state (no warning: each event's twin took the same path)."""
    run = subprocess.run(
        [sys.executable, "-m", "bench.trace"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.stderr == "" and run.stdout.count("| module | entries | calls |") == 2
    for module in ("streams.wire.signing", "market.chain"):  # outside the core: stable names
        assert f"| {module} |" in run.stdout
    assert run.stdout.count("\ncalls ") == 2


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
    for row in (
        "raw aiokafka round trip",
        "Faust pass-through agent",
        "market ingest",
        "market fan-out",
        "market purchase",
    ):
        assert f"| {row}" in out
    # CPU per event with the broker's and the idle rates, and the bytes produced
    assert "| path | worker µs/event | net of idle | worker ÷ pass-through |" in out
    assert "| market purchase (next step → 4 sealed releases + receipt) | **all topics** |" in out
    # the CPU goals, each with its ratio to the same run's pass-through
    assert "worker CPU per value ÷ pass-through's per event <= 1.0x: " in out
    assert "worker CPU per purchase ÷ pass-through's per event <= 1.5x: " in out
    assert "\nmachine: " in out and "load average" in out
    # open-loop purchases at 10/s and at half the measured rate, each with its p99 goal
    assert "| Faust pass-through, 10/s | 10 | 40 |" in out  # the paced rows' floor
    assert "| market purchase, 10/s | 10 | 40 |" in out
    assert "market purchase, 10/s: p99 < 25 ms (wall clock): " in out
    assert "market purchase, 50% of its measured max: p99 < 50 ms (wall clock): " in out


@pytest.mark.slow
def test_report_regenerates(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.report", "--quick", "--no-service", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    assert "11 figures" in out
    from pathlib import Path

    report = (Path(str(tmp_path)) / "report.md").read_text()
    for section in (
        "Accuracy after k relaxation steps",
        "Sample paths",
        "Sparse histograms",
        "Exact counts: discrete Laplace",
        "Running totals",
        "Histogram streams",
        "RAPPOR",
        "social network",
        "Speed of the samplers",
        "Speed of histogram releases",
        "Market core per event",
    ):
        assert section in report
    assert "| histogram | top of 4 steps vs SparseHistogramRelease" in report
    assert report.index("## Speed of the samplers") < report.index("## Speed of histogram")


@pytest.mark.slow
def test_one_section_is_regenerated_in_place(tmp_path: object) -> None:
    """``--only`` rewrites the chosen section and leaves every other byte of the report."""
    from pathlib import Path

    path = Path(str(tmp_path)) / "report.md"
    before = "# Results report\n\nhead\n\n## Factorization mechanism: prefix sums\n\nold\n"
    path.write_text(before + "\n## Service throughput and latency (same broker)\n\nkept\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.report",
            "--quick",
            "--out",
            str(tmp_path),
            "--only",
            "Histogram streams",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = path.read_text()
    assert text.startswith("# Results report\n\nhead\n\n## Histogram streams")
    assert "\n## Factorization mechanism: prefix sums\n\nold\n\n" in text  # untouched
    assert "## Histogram streams" not in before and "## Histogram streams" in text
    assert text.index("## Histogram streams") < text.index("## Factorization")  # in its place
    assert text.endswith("## Service throughput and latency (same broker)\n\nkept\n")


def test_a_section_regenerated_alone_says_when_and_so_does_the_header(tmp_path: object) -> None:
    """After ``--only`` the header kept the whole report's date, so it read as if every
    section were that old; a regenerated section now says it was regenerated alone, and when,
    and the header says sections may be newer and the newest date (once, however many runs)."""
    import time
    from pathlib import Path

    from bench.report import _splice

    path = Path(str(tmp_path)) / "report.md"
    head = (
        "# Results report\n\nGenerated by `python -m bench.report` on a 2-core machine, "
        "2000-01-01. Every ratio is against a baseline.\n"
    )
    path.write_text(head + "\n## A\n\nold a\n\n## B\n\nold b\n")
    sections = [("A", lambda: "new a"), ("B", lambda: "new b")]
    _splice(path, sections, ["A"])
    _splice(path, sections, ["A"])
    today = time.strftime("%Y-%m-%d")
    text = path.read_text()
    assert (
        "on a 2-core machine, 2000-01-01 (sections regenerated alone since say so, the "
        f"latest on {today}). Every ratio"
    ) in text, text
    assert text.count("regenerated alone since") == 1, text
    note = f"*Regenerated alone (`python -m bench.report --only`) on {today}.*"
    assert f"## A\n\n{note}\n\nnew a\n" in text, text
    assert text.endswith("## B\n\nold b\n")  # untouched, and no path of a temporary directory


def test_noise_step_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.noise_step", "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    from market import _step

    if _step.BACKEND != "compiled":
        assert "not available" in out
        return
    assert "| compiled ÷ reference | compiled ÷ numpy call |" in out
    assert "| laplace, purchase (4 values, 1 step) |" in out
    assert "\nmachine: " in out and "SIMD " in out
