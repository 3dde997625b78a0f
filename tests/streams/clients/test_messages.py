"""The small messages a person reads, run as a person runs the commands (subprocesses) against
a live worker: refusals and input errors in the flags typed, a quote at the top step, an empty
list of refusals, times in UTC, ``verify-receipt`` with the pinned market key, and ``publish
--file`` stopped by Ctrl-C and resumed without publishing a value twice."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ..conftest import Market
from ..helpers import TEST_KEYS, cli_parties

ROOT = Path(__file__).resolve().parents[3]
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z"
OTHER_KEY = "Kay64UG8yvCyLhqU000LxzYeUm0L/hLIl5S8kyKWbdc="  # an Ed25519 key, not the market's


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**full, **(env or {})},
        check=False,
    )


def said(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Exit ``code``, every needle in the output, no traceback; the output."""
    text = r.stdout + r.stderr
    assert r.returncode == code, (r.returncode, text)
    assert "Traceback" not in text, text
    for n in needles:
        assert n in text, (n, text)
    return text


@pytest.mark.broker
@pytest.mark.slow
def test_the_messages_name_flags_times_and_what_was_checked(market: Market, tmp_path: Path) -> None:
    market.start_worker()
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    acme, bob = cli_parties(run, pre, tmp_path, "acme", "bob").values()
    # no refusal yet: said, not an empty screen
    said(run(*pre, "rejections"), 0, f"no refusals on {market.topics.rejections} yet")
    said(run(*pre, "register", *acme, "--stream", "temp", "--steps", "1,2"), 0)
    # input errors in words, naming the flag typed (test_flags.py has more)
    bad = ["--purchase-id", "my purchase", "--max-price", "1"]
    text = said(run(*pre, "buy", *bob, "--stream", "temp", *bad), 2, "invalid input: --purchase-id")
    assert "must be 1 to 64 letters, digits, '_' or '-', not 'my purchase'" in text
    # a value's publication time in UTC, its milliseconds under --json
    text = said(run(*pre, "publish", *acme, "--stream", "temp", "--values", "20"), 0, "accepted")
    assert re.search(rf"published at {ISO} \(resend as --value-id \S+ --published-at \d+\)", text)
    assert "published_at_ms=" not in text
    # refusals in the flags of the command: --target, --max-price (not target_level, ...)
    text = said(run(*pre, "quote", *bob, "--stream", "temp", "--rmse", "1e-9"), 1, "--target 2")
    assert "quote refused (accuracy_not_for_sale)" in text and "target_level" not in text
    text = said(run(*pre, "buy", *bob, "--stream", "temp", "--max-price", "0.10"), 1, "--max-price")
    assert "max_price_minor" not in text
    # the top step bought: the quote says there is nothing more to buy (exit 0: an answer)
    out = tmp_path / "outcome.json"
    buy = ["buy", *bob, "--stream", "temp", "--target", "2", "--max-price", "5"]
    said(run(*pre, *buy, "--output", str(out)), 0, "bought level 2")
    text = said(run(*pre, "quote", *bob, "--stream", "temp"), 0)
    assert "you already hold level 2 epsilon of temp, the top level for sale" in text
    assert "nothing more to buy" in text and "2 -> 2" not in text
    # verify-receipt checks with the pinned key, without a broker, and says what it checked
    pinned = {"EMARKET_MARKET_KEY": TEST_KEYS.public_key_b64}
    text = said(run("verify-receipt", str(out), env=pinned), 0, "valid: purchase", "(--market-key)")
    assert (
        f"released values of {out} (1) and its sealed envelope are the ones" in text
        and "catalog" not in text
        and "warning" not in text
    )
    said(run("--market-key", OTHER_KEY, "verify-receipt", str(out)), 1, "INVALID", "not by the key")
    text = said(run(*pre, "verify-receipt", str(out)), 0, "valid: purchase", "(not pinned)")
    assert "warning: trusting the market key" in text and f"{market.topics.identity} on" in text
    assert "catalog" not in text
    # a request signed with a rotated-away key: when, in UTC; the milliseconds under --json
    new = tmp_path / "bob-2.key"
    said(run("keygen", "--account", "bob", "--out", str(new)), 0)
    said(run(*pre, "account", "rotate", *bob, "--new-key-file", str(new), "--version", "2"), 0)
    r = run(*pre, "quote", *bob, "--stream", "temp", "--json")
    text = said(r, 1, "quote refused (key_rotated)")
    assert re.search(rf"since {ISO}\.", text) and "Unix ms" not in text, text
    assert isinstance(json.loads(r.stdout)["details"]["rotated_at_ms"], int)


class _Output:
    """A process's stdout read as it comes (progress lines end with a carriage return)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.text = ""
        self.ended = False
        self._proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        while chunk := os.read(self._proc.stdout.fileno(), 4096):
            self.text += chunk.decode()
        self.ended = True

    def wait_for(self, pattern: str, timeout: float = 90.0) -> re.Match[str]:
        """The first match of ``pattern`` in what the process printed, waited for."""
        deadline = time.monotonic() + timeout
        while (m := re.search(pattern, self.text)) is None:
            assert not self.ended and time.monotonic() < deadline, (pattern, self.text)
            time.sleep(0.01)
        return m


@pytest.mark.broker
@pytest.mark.slow
def test_publish_stopped_by_ctrl_c_says_how_to_resume_and_resumes_once(
    market: Market, tmp_path: Path
) -> None:
    """Ctrl-C in `publish --file` printed no newline and no way to resume; values without ids
    sent again would be published twice. The batch in flight is finished, the command says how
    many values the market answered and the command that resumes after them."""
    market.start_worker()
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    (acme,) = cli_parties(run, pre, tmp_path, "acme").values()
    said(run(*pre, "register", *acme, "--stream", "bulk", "--steps", "1"), 0)
    total = 5_000  # 10 batches of 500: the first Ctrl-C comes long before the last
    values = tmp_path / "values.jsonl"
    values.write_text("".join(f"[{i}]\n" for i in range(total)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
    args = [*pre, "publish", *acme, "--stream", "bulk", "--file", str(values)]
    with subprocess.Popen(
        [sys.executable, "-m", "streams", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    ) as proc:
        out = _Output(proc)
        out.wait_for(rf"published \d+/{total} values")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, out.text
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read().decode()
        m = out.wait_for(rf"stopped by Ctrl-C: (\d+) of {total} values of \S+ sent and answered")
    done = int(m.group(1))
    assert 0 < done < total and done % 500 == 0, out.text
    assert re.search(r"values \(\d+/s\)\n", out.text), "the progress line was not ended"
    resume = out.wait_for(r"resume with: (.*)\n").group(1)
    assert resume.startswith("epsilon-market ") and resume.endswith(f"--skip {done}"), resume
    again = subprocess.run(
        [sys.executable, "-m", "streams", *shlex.split(resume)[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )
    said(again, 0, f"published {total}/{total} values")
    market.wait_ingested("bulk", total)
    assert market.ledger()["bulk"]["values_ingested"] == total  # none published twice
