"""The one-command demo: runs to the end, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where its scratch directory goes
    out = subprocess.run(
        [sys.executable, "-m", "streams", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env=env,
    ).stdout
    assert not list(tmp_path.glob("emarket-demo-*")), "the demo left its keys behind"
    vectors, _, histograms = out.partition("'city-visits'")
    rows = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", vectors, re.M)
    assert [r[0] for r in rows] == ["1", "2", "3"]
    errors = [float(r[3]) for r in rows]
    assert errors[2] < errors[0], "accuracy must improve with the level"
    assert "exactly the direct price" in out and "subscription:" in out
    histograms, _, rappor = histograms.partition("'browser-survey'")
    # RAPPOR: each step flips fewer bits, and the interval of each share narrows
    found = re.findall(
        r"^\s+(\d)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+firefox \S+ \[([\d.]+), ([\d.]+)\]", rappor, re.M
    )
    assert [r[0] for r in found] == ["1", "2", "3"], rappor
    widths = [float(hi) - float(lo) for _, lo, hi in found]
    assert widths[2] < widths[0], rappor
    # histograms: thresholds come down and more of the ten cities show, step by step
    rows = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)", histograms, re.M)
    assert [r[0] for r in rows] == ["1", "2", "3"], histograms
    assert float(rows[2][2]) < float(rows[0][2]) and int(rows[2][3]) > int(rows[0][3])


def test_ctrl_c_stops_everything_it_started() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams", "demo", "--values", "5"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    broker_port = worker_port = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and worker_port is None:
        line = proc.stdout.readline()
        lines.append(line)
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            broker_port = int(m.group(1))
        if m := re.search(r"metrics at http://127\.0\.0\.1:(\d+)", line):
            worker_port = int(m.group(1))
    assert broker_port and worker_port, "".join(lines)
    os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), rest
    time.sleep(0.5)
    assert not _listening(broker_port), "broker still running"
    assert not _listening(worker_port), "worker still running"
