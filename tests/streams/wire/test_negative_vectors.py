"""docs/vectors/negative.json (docs/protocol.md §10.1): every case a client must refuse is
refused by the Python client's checks, and every refusal the market must make is made by the
market's core, with the code the file gives. The Node client runs the client cases too
(clients/node/test/negative.test.js)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import EnvelopeError, open_envelope
from market.errors import ReceiptError
from market.receipts import verify_outcome
from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.wire.answers import AnswerError, verify_answer
from streams.wire.root import root_verdict
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS

ROOT = Path(__file__).resolve().parents[3]
VEC = json.loads((ROOT / "docs" / "vectors" / "negative.json").read_text())
KEY = Ed25519PublicKey.from_public_bytes(base64.b64decode(VEC["market_public_key"]))
T = Topics(VEC["market"])


def _names(cases: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in cases]


# ------------------------------------------------------------------------- the client's checks
@pytest.mark.parametrize("case", VEC["answers"]["cases"], ids=_names(VEC["answers"]["cases"]))
def test_an_answer_is_believed_only_for_the_bytes_sent(case: dict[str, Any]) -> None:
    sent = hashlib.sha256(VEC["answers"]["request"].encode()).hexdigest()
    headers = [(k, None if v is None else bytes.fromhex(v)) for k, v in case["headers"]]
    try:
        bound = verify_answer(KEY, VEC["market"], case["topic"], case["value"].encode(), headers)  # type: ignore[arg-type]
    except AnswerError:
        verdict = "refuse"
    else:
        verdict = "answer" if bound == sent else "other"
    assert verdict == case["verdict"], case["reason"]


@pytest.mark.parametrize("case", VEC["receipts"], ids=_names(VEC["receipts"]))
def test_a_receipt_is_verified_or_refused(case: dict[str, Any]) -> None:
    try:
        verify_outcome(case["outcome"], KEY)
    except ReceiptError:
        verdict = "refuse"
    else:
        verdict = "valid"
    assert verdict == case["verdict"], case["reason"]


@pytest.mark.parametrize("case", VEC["envelopes"], ids=_names(VEC["envelopes"]))
def test_an_envelope_opens_only_as_sealed(case: dict[str, Any]) -> None:
    key = X25519PrivateKey.from_private_bytes(bytes.fromhex(case["private_key"]))
    try:
        open_envelope(key, case["envelope"], case["aad"].encode())
    except EnvelopeError:
        verdict = "refuse"
    else:
        verdict = "opens"
    assert verdict == case["verdict"], case["reason"]


def test_a_root_that_is_not_the_markets_is_refused() -> None:
    roots = VEC["roots"]
    assert len(roots["cases"]) >= 8
    for c in roots["cases"]:
        value = None if c["value_hex"] is None else bytes.fromhex(c["value_hex"])
        got = root_verdict(roots["topic"], value, c["pinned"])
        assert got == {"verdict": c["verdict"], "key": None}, c["name"]


# ------------------------------------------------------------------------- the market's refusals
def _value(event: dict[str, Any]) -> bytes | None:
    if "value" in event:
        return str(event["value"]).encode()
    return None if event["value_hex"] is None else bytes.fromhex(event["value_hex"])


def _line_reasons(outputs: list[Any]) -> list[str]:
    """The reasons of the lines of a ``values_accepted`` among ``outputs``."""
    for out in outputs:
        if T.is_inbox(out.topic) and b'"values_accepted"' in out.value:
            return [line.get("reason") for line in json.loads(out.value)["outcomes"]]
    return []


@pytest.mark.parametrize(
    "case", VEC["market_cases"], ids=[f"{c['code']}: {c['why']}" for c in VEC["market_cases"]]
)
def test_the_market_refuses_with_the_code_given(case: dict[str, Any]) -> None:
    now = case["now_ms"]
    core = MarketCore(
        Stores(),
        TEST_KEYS,
        T,
        clock=lambda: now,
        limits=Limits(**case["limits"]),
        **case["market"],
    )
    for step in case["setup"]:
        out = core.handle(step["topic"], _value(step), partition=step.get("partition"))
        assert out.status != "rejected", (out.reason, step)
    event = case["input"]
    out = core.handle(event["topic"], _value(event), partition=event.get("partition"))
    if case["answered_by"] == "values_line":
        assert case["code"] in _line_reasons(out.outputs), out.outputs
        return
    assert out.reason == case["code"], out.outputs
    refusals = [json.loads(o.value) for o in out.outputs if o.topic == T.refusals]
    if case["code"] == "already_answered":  # a notice, not a refusal (§12.5)
        assert refusals == []
    else:
        assert [r["reason"] for r in refusals] == [case["code"]]


def test_every_code_of_the_spec_is_drawn_or_said_why_not() -> None:
    """§9's codes: each has a case in the file, or the file says why no input draws it."""
    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc.split("\n## 9. Rejections\n")[1].split("\n## 10.")[0]
    codes, in_table = {"refusals_dropped"}, False
    for line in section.splitlines():
        in_table = line.startswith("| code |") or (in_table and line.startswith("|"))
        if in_table and (m := re.match(r"\| `([a-z_]+)` \|", line)):
            codes.add(m.group(1))
    drawn = {c["code"] for c in VEC["market_cases"]}
    assert not drawn - codes, drawn - codes
    assert codes == drawn | set(VEC["unreached"]), sorted(codes - drawn - set(VEC["unreached"]))
    assert len(drawn) >= 45


# ------------------------------------------------------------------------- the resend rule
@pytest.mark.parametrize("case", VEC["resend"]["cases"], ids=_names(VEC["resend"]["cases"]))
def test_a_resend_takes_the_answer_its_notice_names(case: dict[str, Any]) -> None:
    """§12.4: the answers to the id and stream in the inbox, the notice's details, and the
    one the Python client takes (never the refusal of another request that used the id)."""
    from streams.clients.client import _answers, named_answer
    from streams.wire.events import PurchaseFulfilled, Rejection

    rs = VEC["resend"]
    earlier: list[tuple[str, Any]] = []
    for i in case["earlier"]:
        raw = rs["answers"][i]
        doc = json.loads(raw)
        model = PurchaseFulfilled if doc["type"] == "purchase_fulfilled" else Rejection
        ev = model.model_construct(**doc)
        if _answers(ev, rs["request_id"], rs["stream_id"]):
            earlier.append((hashlib.sha256(raw.encode()).hexdigest(), ev))
    notice = Rejection.model_construct(reason="already_answered", details=case["details"])
    got = named_answer(notice, earlier)
    want = None if case["taken"] is None else json.loads(rs["answers"][case["taken"]])
    assert (None if got is None else got.model_dump(include=set(want or {}))) == want
