"""A seller's numbering of its value batches (streams/clients/numbering.py, docs/protocol.md
§6.4.1): learnt from the market, a number used again only once the market did not take it."""

from __future__ import annotations

from typing import Any

from streams.clients.numbering import OUT_OF_WINDOW, Numbering
from streams.wire.events import Rejection, ValueOutcome, ValuesAccepted


def _answer(*statuses: str, **kw: Any) -> ValuesAccepted:
    lines = [
        ValueOutcome.model_validate({"value_id": f"v{i}", "status": s})
        for i, s in enumerate(statuses)
    ]
    return ValuesAccepted(stream_id="s", seller_id="me", outcomes=lines, **kw)


def _refusal(reason: str, message: str = "m", **details: Any) -> Rejection:
    return Rejection.model_validate(
        {
            "reason": reason,
            "message": message,
            "source_topic": "t.values",
            "payload": "",
            "payload_bytes": 0,
            "payload_sha256": "0" * 64,
            "details": details,
        }
    )


def test_a_new_process_numbers_0_until_told_then_fills_the_lost_numbers_first() -> None:
    n = Numbering()
    assert [n.take("s"), n.take("s")] == [0, 0]
    n.settle("s", 0, _answer("accepted", batch_seq=0, next_batch_seq=9, missing_batch_seqs=[4]))
    n.settle("s", 0, _answer("accepted", batch_seq=0, next_batch_seq=2, missing_batch_seqs=[]))
    assert [n.take("s"), n.take("s"), n.take("s"), n.take("other")] == [4, 9, 10, 0]


def test_a_number_is_used_again_only_once_the_market_did_not_take_it() -> None:
    n = Numbering()
    n.settle("s", 0, _answer("accepted", batch_seq=0, next_batch_seq=1, missing_batch_seqs=[]))
    one, two, three, four = (n.take("s") for _ in range(4))
    n.settle("s", one, _answer("accepted", "accepted", batch_seq=one))  # taken
    n.settle("s", two, _answer("accepted", "rejected"))  # a value refused: not taken
    n.settle("s", three, _refusal("batch_too_large", max_values=1))  # refused whole
    n.settle("s", four, None)  # no answer: it may be taken yet
    assert [n.take("s"), n.take("s"), n.take("s")] == [2, 3, 5]


def test_a_number_too_far_ahead_goes_on_from_where_the_market_says() -> None:
    n = Numbering()
    n.settle("s", 0, _answer("accepted", batch_seq=0, next_batch_seq=300, missing_batch_seqs=[]))
    held, far = n.take("s"), n.take("s")
    again = n.settle("s", far, _refusal(OUT_OF_WINDOW, through=7, missing=[8, 300], next=400))
    assert again and held == 300 and [n.take("s"), n.take("s"), n.take("s")] == [8, 400, 401]


def test_a_market_that_numbers_no_batch_gets_them_unnumbered() -> None:
    n = Numbering()
    old = _refusal(
        "invalid_event", "not a valid value event: batch_seq: Extra inputs are not permitted"
    )
    assert n.take("s") == 0 and n.settle("s", 0, old) is True
    assert n.take("s") is None and n.take("other") == 0
