"""Value batches numbered by their sellers (docs/protocol.md §6.4.1).

A stream keeps a watermark and at most a window of numbers above it, so it recognises a resend
of any batch it applied however many values came since (a value's mark is forgotten past
``Caps.marks``), answers it with the bytes of the first answer, refuses a number too far above
the watermark with where the numbering stands, and lets a batch it refused leave its number
free.
"""

from __future__ import annotations

from typing import Any

from streams.core import MarketCore, Stores
from streams.core.codecs import decode_stream, encode_stream
from streams.core.context import Limits
from streams.core.replay.records import Caps
from streams.core.state import BATCH_WINDOW, BatchNumbers
from streams.wire.events import Rejection, ValuesAccepted
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, open_accounts, registration, values

T = Topics("t")
GOOD = [1.0, 2.0, 3.0]


def _core(stores: Stores | None = None, marks: int = 8) -> MarketCore:
    c = MarketCore(
        stores or Stores(),
        TEST_KEYS,
        T,
        clock=lambda: 10_000,
        limits=Limits(record_caps=Caps(marks=marks)),
    )
    open_accounts(c, "seller1")
    return c


def _send(c: MarketCore, n: int | None, ids: list[str], at: int = 1_000, **kw: Any) -> Any:
    return c.handle(
        T.values, values("temp", [(i, kw.get("x", GOOD)) for i in ids], batch_seq=n, **_at(at))
    )


def _at(at: int) -> dict[str, Any]:
    return {"published_at_ms": at}


def _answer(out: Any) -> tuple[bytes, list[tuple[str, bytes | None]]]:
    """The inbox answer's value and headers."""
    (o,) = [o for o in out.outputs if o.topic == T.inbox("seller1")]
    return o.value, list(o.headers or [])


def _numbers(c: MarketCore) -> BatchNumbers:
    nums = c.stores.streams["temp"].batch_numbers
    assert nums is not None
    return nums


def _refusal(out: Any) -> Rejection:
    (o,) = [o for o in out.outputs if o.topic == T.inbox("seller1")]
    return Rejection.model_validate_json(o.value)


def test_a_resend_far_below_the_watermark_is_answered_with_the_first_answers_bytes() -> None:
    stores = Stores()
    c = _core(stores)
    assert c.handle(T.registrations, registration("temp", retain_last=1)).status == "accepted"
    first = _send(c, 1, ["a0", "a1"])
    assert first.status == "accepted", first.reason
    for n in range(2, 40):  # 76 more values: the stream keeps 8 marks
        out = _send(c, n, [f"v{n}a", f"v{n}b"], at=1_000 + n)
        assert out.status == "accepted", out.reason
    assert "temp/a0" not in stores.releases  # its mark is forgotten
    unnumbered = c.handle(T.values, values("temp", [("a0", GOOD)], published_at_ms=1_000))
    assert unnumbered.items == [("rejected", "value_too_old")]  # what a v1 resend gets
    again = _send(c, 1, ["a0", "a1"])
    assert again.status == "duplicate"
    assert _answer(again) == _answer(first)
    answer = ValuesAccepted.model_validate_json(_answer(first)[0])
    assert answer.batch_seq == 1 and {o.status for o in answer.outcomes} == {"accepted"}
    assert _numbers(c) == BatchNumbers(through=39)
    restarted = _core(stores)  # the numbering is in the stream's record
    assert _answer(_send(restarted, 1, ["a0", "a1"])) == _answer(first)
    assert _send(restarted, 40, ["n40"], at=2_000).status == "accepted"


def test_numbers_above_the_watermark_are_bounded_and_too_far_is_refused_with_the_gaps() -> None:
    c = _core()
    c.handle(T.registrations, registration("temp", retain_last=1))
    for n in range(2, BATCH_WINDOW + 1):  # 1 is late: every other number of the window
        assert _send(c, n, [f"v{n}"], at=1_000 + n).status == "accepted"
    assert _numbers(c).through == 0 and len(_numbers(c).above) == BATCH_WINDOW - 1
    far = _send(c, BATCH_WINDOW + 1, ["far"], at=2_000)
    rej = _refusal(far)
    assert (far.reason, rej.details["missing"], rej.details["next"]) == (
        "batch_seq_out_of_window",
        [1],
        BATCH_WINDOW + 1,
    )
    assert "Number this batch 1" in rej.message
    assert "far" not in {k.rsplit("/", 1)[-1] for k in c.stores.releases}  # not applied
    assert _send(c, 1, ["late"], at=1_500).status == "accepted"
    assert _numbers(c) == BatchNumbers(through=BATCH_WINDOW)
    assert _send(c, BATCH_WINDOW + 1, ["far"], at=2_000).status == "accepted"
    assert _send(c, BATCH_WINDOW + 5, ["gap"], at=2_001).status == "accepted"
    ask = _send(c, 0, ["new0"], at=2_000)  # a seller's new process learns where it stands
    standing = ValuesAccepted.model_validate_json(_answer(ask)[0])
    assert (standing.next_batch_seq, standing.missing_batch_seqs) == (
        BATCH_WINDOW + 6,
        [BATCH_WINDOW + 2, BATCH_WINDOW + 3, BATCH_WINDOW + 4],
    )
    assert ask.status == "accepted" and _numbers(c).through == BATCH_WINDOW + 1


def test_a_batch_with_a_value_refused_takes_no_number() -> None:
    c = _core()
    c.handle(T.registrations, registration("temp", retain_last=1))
    out = c.handle(T.values, values("temp", [("ok", GOOD), ("bad", [1.0])], batch_seq=1))
    assert [s for s, _ in out.items] == ["accepted", "rejected"]
    assert c.stores.streams["temp"].batch_numbers is None
    fixed = c.handle(T.values, values("temp", [("ok", GOOD), ("bad", GOOD)], batch_seq=1))
    answer = ValuesAccepted.model_validate_json(_answer(fixed)[0])
    assert [o.status for o in answer.outcomes] == ["accepted", "accepted"]  # "ok" was known
    assert _numbers(c) == BatchNumbers(through=1)


def test_a_record_without_numbers_reads_and_keeps_its_bytes() -> None:
    c = _core()
    c.handle(T.registrations, registration("temp", retain_last=1))
    c.handle(T.values, values("temp", [("v", GOOD)]))
    record = c.stores.streams["temp"]
    assert b"batch_numbers" not in encode_stream(record)
    assert decode_stream(encode_stream(record)).batch_numbers is None
    _send(c, 1, ["w"], at=1_001)
    assert decode_stream(encode_stream(c.stores.streams["temp"])).batch_numbers == BatchNumbers(
        through=1
    )
