"""The operators' tables say what the code does: every refusal reason the market can give is in
docs/operations.md's reason table, and every topic the market names is in docs/architecture.md's
topic table (and neither table names one the code does not).

The reasons are collected from the code itself, where they are written: the codes of ``Reject``
(and of the errors the market turns into refusals: ``market.errors``, invitations, the wire's
own codes), the ``reason=`` of the rejections and outcomes it builds, and the horizon's words.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from market import errors
from streams.core.answering import DROPPED
from streams.wire.events import REFUSAL_CODES
from streams.wire.topics import Topics

ROOT = Path(__file__).resolve().parents[1]
_CODE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[a-z]+")

NOT_REFUSALS = {
    "market_error",
    "sealed_state",
    "bad_state_format",
    "receipt_invalid",
    "bad_envelope",
}
"""``market`` error codes never given as the answer to an event: raised on the market's own
state, on a receipt, or on an envelope (one a batch carries is refused as ``bad_seal``, a
sealing key that cannot be used as ``invalid_key``)."""


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if _CODE.fullmatch(node.value) else None
    return None


def _called(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def reasons_in_code() -> set[str]:
    """Every reason code a rejection of the market may carry."""
    found = set(REFUSAL_CODES) | {DROPPED}
    found |= {c.code for c in _subclasses(errors.MarketError) if c.code not in NOT_REFUSALS}
    for path in sorted((ROOT / "streams").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = _called(node)
            if name in ("Reject", "InvitationError") and node.args:
                found.add(_literal(node.args[0]) or "")
            if name == "_Words":  # the horizon's refusals: too old, from the future
                found |= {_literal(a) or "" for a in node.args[3:5]}
            if name in ("Outcome", "Rejection", "ValueOutcome"):
                found |= {_literal(k.value) or "" for k in node.keywords if k.arg == "reason"}
    return found - {""}


def _subclasses(cls: type[errors.MarketError]) -> list[type[errors.MarketError]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _table(doc: str, header: str) -> list[str]:
    """The first cells of the rows of the Markdown table of ``doc`` whose header row starts
    with ``header``."""
    lines = (ROOT / "docs" / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:  # after the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return rows


def test_the_reason_table_names_every_refusal_reason() -> None:
    cells = _table("operations.md", "| reason | fix |")
    documented = {c for cell in cells for c in re.findall(r"`([a-z0-9_]+)`", cell)}
    in_code = reasons_in_code()
    assert {"price_too_high", "key_rotated", "already_answered"} <= in_code  # the collector works
    assert in_code - documented == set(), "reasons missing from docs/operations.md"
    assert documented - in_code == set(), "docs/operations.md names reasons the code never gives"


def test_the_topic_table_names_every_topic() -> None:
    cells = _table("architecture.md", "| topic | key |")
    documented = {m for cell in cells for m in re.findall(r"`(<p>\.[^`]+)`", cell)}
    t = Topics("<p>")
    in_code = {s.name for s in t.specs()} | {t.inbox("<account_id>")}
    assert in_code - documented == set(), "topics missing from docs/architecture.md"
    assert documented - in_code == set(), "docs/architecture.md names topics the code never makes"
