"""The test suite's own output: a Kafka client left running prints nothing outside a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log_outside_pytest(setup: str) -> str:
    """What an aiokafka error logged with no pytest capture active writes to stderr."""
    line = "logging.getLogger('aiokafka.client').error('Unable connect to node with id 1')"
    code = f"{setup}\nimport logging\n{line}"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stderr


def test_kafka_client_lines_stay_off_the_terminal_between_tests() -> None:
    assert "Unable connect" in log_outside_pytest("")  # logging.lastResort: the terminal
    assert log_outside_pytest("import tests.conftest") == ""
