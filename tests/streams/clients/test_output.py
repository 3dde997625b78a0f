"""What the command line prints: lines a person reads by default, JSON with ``--json``.

The market's answers are made by :class:`MarketCore` (no broker), rendered as ``tail`` and
``buy`` render them, and read for the facts a person needs: ids, levels with their unit,
prices with their currency, the noise in the value's units, and counts as whole numbers.
The commands that need no broker (``keygen``, ``verify-receipt``, ``schemas``) run as a
person runs them, in both modes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.clients.commands import output
from streams.wire.events import INBOX_EVENT
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, market_core, purchase, quote, registration, value

ROOT = Path(__file__).resolve().parents[3]
T = Topics("t")


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def shown(ev: Any) -> str:
    text = "\n".join(output.event(ev))
    assert "{" not in text and "}" not in text, text  # never JSON
    return text


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (12.0, "12"),
        (-0.0, "0"),
        (-8.0, "-8"),
        (2.5, "2.5"),
        (20.123046875, "20.123"),
        (2.0**52, "4503599627370496"),
        (1e20, "1e+20"),
        (float("inf"), "inf"),
    ],
)
def test_whole_numbers_print_as_whole_numbers(x: float, text: str) -> None:
    assert output.number(x) == text


def test_a_purchase_and_the_inbox_read_as_a_person_reads_them() -> None:
    c = market_core("seller1", "alice")
    assert c.handle(T.registrations, registration("temp")).status == "accepted"
    (line,) = inbox(c.handle(T.values, value("temp", "v0", [20.0, 1.0, 2.0])), "seller1")
    assert shown(line) == "values of temp: v0 accepted"
    (q,) = inbox(c.handle(T.purchases, quote("temp", "alice", "q1")), "alice")
    assert re.fullmatch(
        r"quote q1 on temp: level 0 -> \S+ epsilon costs \d+\.\d\d EUR", shown(q)
    ), shown(q)
    out = c.handle(T.purchases, purchase("temp", "alice", "p1"))
    (bought,) = inbox(out, "alice")
    (sale,) = inbox(out, "seller1")  # the seller learns of the sale
    assert re.fullmatch(
        r"sold temp to buyer [0-9a-f]{16}: level 0 -> \S+ epsilon for "
        r"\d+\.\d\d EUR, 1 values",
        shown(sale),
    ), shown(sale)
    text = shown(bought)
    assert re.match(
        r"bought temp at level \S+ epsilon \(from 0\) for \d+\.\d\d EUR, purchase "
        r"p1: 1 values\n  v0 +\S+ \S+ \S+\n  noise: Laplace scale \S+; each "
        r"number's RMS error \S+, ±\S+ at 95 %$",
        text,
    ), text
    (refused,) = inbox(
        c.handle(T.purchases, purchase("temp", "alice", "p2", target_level=3.0)), "alice"
    )
    assert shown(refused).startswith("refused (level_not_for_sale) purchases temp p2: "), shown(
        refused
    )


def test_counts_are_released_and_shown_as_whole_numbers() -> None:
    """A discrete Laplace release printed ``-8.0`` and ``12.0``: counts print as ``-8``, ``12``
    (the noise may take a count below zero; the count itself never is)."""
    c = market_core("seller1", "alice")
    c.handle(
        T.registrations,
        registration(
            "visits", mechanism="discrete_laplace", dimension=4, steps=[0.5, 1.0], cap=1.0
        ),
    )
    assert c.handle(T.values, value("visits", "d1", [12.0, 0.0, 3.0, 7.0])).status == "accepted"
    (bought,) = inbox(c.handle(T.purchases, purchase("visits", "alice", "p1")), "alice")
    text = shown(bought)
    row = re.search(r"^  d1 +(.*)$", text, re.M)
    assert row is not None and re.fullmatch(r"(-?\d+ ){3}-?\d+", row.group(1)), text
    assert "noise: discrete Laplace scale" in text


def test_a_value_refused_as_not_a_count_reads_as_such() -> None:
    c = market_core("seller1")
    c.handle(
        T.registrations,
        registration("visits", mechanism="discrete_laplace", dimension=2, steps=[1.0], cap=1.0),
    )
    (line,) = inbox(c.handle(T.values, value("visits", "d1", [3.0, -4.0])), "seller1")
    assert shown(line) == "values of visits: d1 rejected (invalid_count)"


def test_keygen_prints_for_a_person_and_json_for_machines(tmp_path: Path) -> None:
    r = cli("keygen", "--account", "alice", "--out", "a.key", cwd=tmp_path)
    assert r.returncode == 0 and "{" not in r.stdout, r.stdout + r.stderr
    assert "wrote a.key (mode 0600) for account 'alice'" in r.stdout and "sealing key" in r.stdout
    for n, args in enumerate((["--json", "keygen"], ["keygen", "--json"])):  # either place
        r = cli(*args, "--account", "bob", "--out", f"b{n}.key", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        made = json.loads(r.stdout)  # stdout holds only the JSON; the person's lines: stderr
        assert made["account_id"] == "bob" and made["sealing_key"] and "wrote" in r.stderr


def test_verify_receipt_prints_a_verdict_or_json(tmp_path: Path) -> None:
    c = market_core("seller1", "alice")
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [20.0, 1.0, 2.0]))
    out = c.handle(T.purchases, purchase("temp", "alice", "p1"))
    path = tmp_path / "outcome.json"
    path.write_bytes(next(o.value for o in out.outputs if o.topic == T.inbox("alice")))
    key = ["--public-key", TEST_KEYS.public_key_b64]
    r = cli("verify-receipt", str(path), *key)
    assert r.returncode == 0 and r.stdout.startswith("valid: purchase p1 by alice on temp")
    r = cli("verify-receipt", str(path), *key, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["receipt"]["purchase_id"] == "p1"
    data = json.loads(path.read_text())
    data["price_minor"] += 1
    path.write_text(json.dumps(data))
    r = cli("--json", "verify-receipt", str(path), *key)
    assert r.returncode == 1 and json.loads(r.stdout)["valid"] is False, r.stdout


def test_long_running_commands_refuse_json(tmp_path: Path) -> None:
    r = cli("--json", "serve", cwd=tmp_path)
    assert r.returncode == 2 and "no JSON output" in r.stderr and not r.stdout
