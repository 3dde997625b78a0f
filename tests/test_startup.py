"""The command line starts fast where a person waits on it: ``--help`` and ``keygen`` import
neither the numerics (numpy, scipy, randomgen) nor the models (pydantic) nor the broker stack.

Checked by what is imported, never by timing: ``python -X importtime`` lists every module a
run imports, on stderr.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"numpy", "scipy", "randomgen", "pydantic", "aiokafka", "faust", "mode", "asyncio"}


def imported_by(*args: str, cwd: Path) -> set[str]:
    """The top-level packages ``python -m streams ARGS`` imports (it must exit 0)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "streams", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    names = (
        line.rsplit("|", 1)[-1].strip()
        for line in r.stderr.splitlines()
        if line.startswith("import time:")
    )
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["keygen", "--account", "alice", "--out", "alice.key"],
        ["keygen", "--account", "acme", "--out", "acme.key", "--no-sealing"],
    ],
    ids=["help", "keygen", "keygen-no-sealing"],
)
def test_help_and_keygen_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    loaded = imported_by(*args, cwd=tmp_path)
    assert "streams" in loaded and ("cryptography" in loaded or args == ["--help"]), loaded
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
