"""The benchmark scripts still run (a smoke test, not a timed test: numbers are not checked)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from bench import noise

OPENDP = importlib.util.find_spec("opendp") is not None


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
    # issue #42's rows against numpy, each with its goal
    for mech, op, goal in (
        ("laplace", "fresh", 2),
        ("laplace", "bridge", 3),
        ("gaussian", "tighten", 2),
        ("gaussian", "relax", 3),
        ("discrete_laplace", "fresh", 1.5),
        ("discrete_laplace", "tighten", 1.5),
        ("discrete_laplace", "bridge", 3),
    ):
        assert f"| {mech} | {op} |" in out and f"| <= {goal:g}x: " in out
    # per coordinate and per call at the service's size, against numpy and (when installed)
    # OpenDP's exact samplers, each table with its machine line
    assert "## Per coordinate: numpy's inexact samplers and OpenDP's exact ones" in out
    assert "## Per call at 8 numbers (the service's size)" in out
    assert "| mechanism | ours µs per value-step | numpy µs per call | ours ÷ numpy |" in out
    assert out.count("\nmachine: ") == 5
    assert (noise.OPENDP_MISSING in out) is not OPENDP
    for row in (
        "top of 4 steps vs SparseHistogramRelease, 4 rounds",
        "the same, plus building the stream's survival law",
        "vs a Gaussian vector of as many numbers",
        "domain 2^60 vs 2^20",
        noise.HIST_NUMPY,
        noise.HIST_STARTS,
    ):
        assert f"| histogram | {row} |" in out
    assert "## Memory per stored value" in out
    # RAPPOR releases against numpy's thresholded Laplace, in the same run (issue #44)
    assert "## RAPPOR releases" in out
    for row in ("top level", "lowest level (3 steps)"):
        assert f"| {row} |" in out


def test_core_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.core", "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for row in (
        "purchase (next step, 4 values, sealed, receipt)",
        "value (8 numbers, 2 holders), one value per batch",
        "value (8 numbers, 2 holders), 16 values per batch",
    ):
        assert f"| {row} |" in out
    assert "| core CPU µs/event | crypto floor CPU µs | core / floor |" in out
    # issue #42's goals, one per path, and the core's own crypto calls: the floor's
    assert "| core / floor <= 3x: " in out and "| core / floor <= 3.5x: " in out
    assert "| core <= 120 µs per value: " in out
    assert "| crypto calls per event: floor | counted in the core |" in out
    assert out.count(" | the same | ") == 3
    assert "\nmachine: " in out and "SIMD " in out


def test_without_opendp_its_rows_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenDP is an optional extra: without it the rows name the command that installs it,
    and the numpy columns are still measured."""
    monkeypatch.setitem(sys.modules, "opendp", None)  # `import opendp` raises ImportError
    monkeypatch.setitem(sys.modules, "opendp.prelude", None)
    assert noise.opendp_samplers(8) is None
    small = noise.small_markdown(2, 1)
    exact = noise.exact_markdown(1000, 10, 1, 1)
    for table in (small, exact):
        rows = [line for line in table.splitlines() if line.startswith("| discrete_laplace |")]
        assert len(rows) == 1 and "opendp not installed (pip install .[bench])" in rows[0]
        assert "(`opendp` not installed)" in table


@pytest.mark.skipif(not OPENDP, reason="opendp not installed (pip install .[bench])")
def test_with_opendp_its_exact_samplers_are_timed_beside_ours() -> None:
    small = noise.small_markdown(2, 1)
    exact = noise.exact_markdown(1000, 10, 1, 1)
    for table in (small, exact):
        assert noise.OPENDP_MISSING not in table and "(`opendp` installed)" in table
        for mech in ("laplace", "gaussian", "discrete_laplace"):
            row = next(line for line in table.splitlines() if line.startswith(f"| {mech} |"))
            assert row.count("x |") >= 2  # ours ÷ numpy, OpenDP ÷ ours
    assert exact.count("| met |") + exact.count("| not met |") == 3


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
        "raw aiokafka forward (transport floor)",
        "Faust pass-through agent",
        "market ingest (value → 2 releases)",
        "market ingest, 16 values per batch (value → 2 releases)",
        "market fan-out",
        "market purchase",
    ):
        assert f"| {row}" in out
    # CPU per event with the broker's and the idle rates, and the bytes produced
    assert (
        "| path | worker µs/event | net of idle | worker ÷ transport floor | worker ÷ "
        "pass-through (retired goal) |"
    ) in out
    assert "| market purchase (next step → 4 sealed releases + receipt) | **all topics** |" in out
    # each market path against the crypto floor and the transport floor of the same run
    assert (
        "| path | worker µs/event | core µs/event | crypto floor µs/event | core ÷ crypto "
        "floor | records produced/event | worker outside the core µs/record produced | "
        "transport floor µs/record | worker events per core-second |"
    ) in out
    # issue #42's goals against the floors; the pass-through's ratio kept, without a verdict
    assert "worker events per core-second, values at 16 per batch >= 5,000: " in out
    assert "worker events per core-second, purchases >= 1,500: " in out
    assert "worker CPU outside the core per record produced, market purchase <= 15 µs: " in out
    assert "retired (issue #42): worker CPU per purchase ÷ pass-through's per event" in out
    assert "\nmachine: " in out and "load average" in out
    assert out.count("Load average (1 min) at each run's start → end, run by run: ") == 2
    # open-loop purchases at 10/s and at a fixed 200/s, each with its p99 goal
    assert "| Faust pass-through, 10/s | 10 | 20 |" in out  # the paced rows' floor
    assert "| market purchase, 10/s | 10 | 20 |" in out
    assert "market purchase, 10/s: p99 < 25 ms (wall clock): " in out
    assert "market purchase, 200/s: p99 < 50 ms (wall clock): " in out


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
        "Noise per coordinate against numpy and OpenDP's exact samplers",
        "Noise per call at 8 numbers",
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
