"""The README's two-terminal walkthrough, run as written.

Terminal 1 is ``epsilon-market serve`` (its own embedded broker, as a user runs it); terminal 2
is the README's ``<!-- walkthrough -->`` block, run by bash with ``set -e`` after the
``export`` line that ``serve`` printed. A README edit that breaks a command fails here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streams.broker.embedded import find_free_port

ROOT = Path(__file__).resolve().parents[3]


def walkthrough() -> str:
    """The sh block that follows the ``<!-- walkthrough -->`` marker in README.md."""
    text = (ROOT / "README.md").read_text()
    after = text.split("<!-- walkthrough -->", 1)[1]
    match = re.search(r"```sh\n(.*?)```", after, re.S)
    assert match, "README.md: no ```sh block after <!-- walkthrough -->"
    return match.group(1)


def fake_venv(home: Path) -> None:
    """``.venv/bin/activate`` in the walkthrough's directory: puts this interpreter's
    ``epsilon-market`` first on PATH (a shim if the console script is not installed)."""
    bin_dir = home / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    real = Path(sys.executable).parent / "epsilon-market"
    shim = bin_dir / "epsilon-market"
    if real.exists():
        shim.symlink_to(real)
    else:
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m streams "$@"\n')
        shim.chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')


class Serve:
    """Terminal 1: ``epsilon-market serve``, its output collected in the background."""

    def __init__(self, home: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
        env["EMARKET_WEB_PORT"] = str(find_free_port())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams", "serve"],
            cwd=home,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def export_line(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.strip().startswith("export EMARKET_BROKER="):
                    return line.strip()
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.1)
        raise AssertionError("serve printed no export line:\n" + "".join(self.lines))

    def stop(self) -> int:
        """Ctrl-C, as the README says."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        finally:
            self.reader.join(timeout=10)
            assert self.proc.stdout is not None
            self.proc.stdout.close()


@pytest.mark.broker
@pytest.mark.slow
def test_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    fake_venv(tmp_path)
    serve = Serve(tmp_path)
    try:
        export = serve.export_line()
        script = f"set -euo pipefail\n{export}\n{walkthrough()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
        r = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        code = serve.stop()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Traceback" not in out, out
    assert code == 0, "".join(serve.lines)
    assert re.search(r"key id [0-9a-f]{16}", "".join(serve.lines)), "".join(serve.lines)
    assert "on first use" not in out, out  # the walkthrough pins the key serve printed
    assert out.count(" accepted") == 2, out  # each publish waited for its answer
    assert "bought level 0.5 (epsilon) of temp for 0.50 EUR: 2 values (outcome" in out
    assert "bought level 1 (epsilon) of temp for 0.50 EUR: 2 values" in out
    assert re.search(r"^reserved more on temp: level 0\.5 -> 1 epsilon for 0\.50 EUR", out, re.M)
    assert re.search(r"^valid: purchase \S+ by alice on temp .* 0\.50 EUR, 2 values$", out, re.M)
    # every command's output is for a person: lines and tables with units, never JSON
    assert "{" not in r.stdout, r.stdout
    assert re.search(
        r"^registered stream 'temp' of acme: .*\n  for sale: 0\.5 epsilon "
        r"\(0\.50 EUR\), 1 epsilon \(1\.00 EUR\)",
        r.stdout,
        re.M,
    ), r.stdout
    assert re.search(r"^0\.5 .* 0\.50 EUR  <- this quote$", r.stdout, re.M), r.stdout
    # tail shows alice's inbox with her two purchases opened: four values of four numbers
    inbox = r.stdout.split("account alice: open", 1)[1]
    assert len(re.findall(r"^bought temp at level \S+ epsilon", inbox, re.M)) == 2, inbox
    assert len(re.findall(r"^  \S+( -?\d+(\.\d+)?){4}$", inbox, re.M)) == 4, inbox
    assert (
        len(re.findall(r"^  noise: Laplace scale [12]; each number's RMS error", inbox, re.M)) == 2
    ), inbox
    sold = re.findall(
        r"^temp\s+[0-9a-f]{16} (0\.5|0) -> (1|0\.5) epsilon\s+0\.50 EUR\s+2  ", out, re.M
    )
    assert sold == [("0", "0.5"), ("0.5", "1")], out  # the seller's sales, then their total
    assert re.search(r"^total temp\s+2 sales\s+1\.00 EUR$", out, re.M), out
    assert re.search(r"^acme\s+1\.00 EUR\s+temp$", out, re.M), out  # the ledger
    assert re.search(r"^alice\s+temp\s+1\s+1\.00 EUR 2$", out, re.M), out
    # serve stays quiet: its banner, then nothing but warnings, and no error at all
    logged = "".join(serve.lines)
    assert "ERROR" not in logged and "Traceback" not in logged, logged
    noisy = [x for x in serve.lines[4:] if x.strip() and "WARN" not in x]
    assert len(noisy) <= 5, logged
