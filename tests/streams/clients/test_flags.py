"""What a person reads about what was typed: field names as the command's flags, validation
errors as sentences, a quote at or below the level held (pure formatting: no broker)."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest
from pydantic import ValidationError

from streams.clients.commands import output
from streams.clients.commands.flags import in_flags, input_problem
from streams.wire.events import INBOX_EVENT, StreamRegistration
from streams.wire.times import utc_text
from streams.wire.topics import Topics

from ..helpers import market_core, purchase, quote, registration, value

T = Topics("t")
BUY = argparse.Namespace(command="buy", target=None, max_price="1", purchase_id=None, stream="s")
TAIL = argparse.Namespace(command="tail", key_file="k")
REGISTER = argparse.Namespace(
    command="register", stream="s", steps=[1.0], cap=None, retain=16, currency="EUR"
)


def test_field_names_read_as_the_flags_of_the_command() -> None:
    said = "costs 1.00 EUR, more than max_price_minor; buy it with target_level 2"
    assert in_flags(BUY, said) == "costs 1.00 EUR, more than --max-price; buy it with --target 2"
    assert in_flags(TAIL, said) == said  # tail has neither flag: the fields keep their names
    # English words that are also fields stay words outside the model's own rules
    assert in_flags(REGISTER, "steps of the cap") == "steps of the cap"
    assert in_flags(REGISTER, "lower retain_last") == "lower --retain"
    assert in_flags(BUY, "stream 'target_level' is unknown") == "stream 'target_level' is unknown"


def test_a_window_cap_refused_names_the_flag_that_sets_it() -> None:
    """The rule says "window cap", which the register command sets with --window-cap (not
    --cap, the stream's own)."""
    register = argparse.Namespace(**vars(REGISTER), window_cap=8.0000000001, privacy_window=1)
    text = _problem(
        steps=[1.0],
        cap=1.0,
        privacy_unit="window",
        window={"duration_ms": 3_600_000, "cap": 8.0000000001},
        args=register,
    )
    assert "the --window-cap 8.0000000001 has more than 9 decimal places" in text, text
    assert "give the --window-cap as 8.0, or another" in text, text


def _problem(args: argparse.Namespace = REGISTER, **fields: Any) -> str:
    body = {
        "stream_id": "s",
        "seller_id": "acme",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 1,
        "steps": [1.0],
        "cap": 1.0,
        "retain_last": 16,
        "pricing": {"kind": "linear_level", "rate_per_level": 100},
        "currency": "EUR",
        "key_id": "0" * 16,
        "signature": "A" * 86 + "==",
        **fields,
    }
    with pytest.raises(ValidationError) as err:
        StreamRegistration.model_validate(body)
    return input_problem(args, err.value)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"steps": [0.0, 1.0]}, "--steps (its 1st value) must be more than 0, not 0"),
        ({"steps": [2.0, 1.0]}, "--steps must be strictly increasing"),
        ({"stream_id": "a/b"}, "--stream must be 1 to 64 letters, digits, '_' or '-', not 'a/b'"),
        ({"currency": "EURO"}, "--currency must be a currency's three capital letters"),
        ({"retain_last": 0}, "--retain must be 1 or more, not 0"),
        ({"dimension": 0}, "dimension must be 1 or more"),  # REGISTER has no --dimension here
    ],
)
def test_validation_errors_read_as_sentences_naming_the_flags(
    fields: dict[str, Any], says: str
) -> None:
    text = _problem(**fields)
    assert says in text, text
    assert "Input should" not in text and "Value error" not in text and "String should" not in text


def test_a_quote_at_or_below_the_level_held_says_there_is_nothing_to_buy() -> None:
    c = market_core("seller1", "alice", "bob")
    assert c.handle(T.registrations, registration("temp")).status == "accepted"
    c.handle(T.values, value("temp", "v0", [20.0, 1.0, 2.0]))

    def quoted(buyer: str, qid: str, **kw: Any) -> str:
        out = c.handle(T.purchases, quote("temp", buyer, qid, **kw))
        (q,) = [
            INBOX_EVENT.validate_json(o.value) for o in out.outputs if o.topic == T.inbox(buyer)
        ]
        return output.quote_line(q)

    assert re.fullmatch(r"level 0 -> 0\.5 \(epsilon\) costs \d+\.\d\d EUR", quoted("alice", "q1"))
    assert c.handle(T.purchases, purchase("temp", "alice", "p1", target_level=4.0)).status == (
        "fulfilled"
    )
    top = quoted("alice", "q2")
    assert (
        top == "you already hold level 4 epsilon of temp, the top level for sale: there is "
        "nothing more to buy"
    ), top
    assert c.handle(T.purchases, purchase("temp", "bob", "p2", target_level=1.0)).status == (
        "fulfilled"
    )
    below = quoted("bob", "q3", target_level=0.5)
    assert "you already hold level 1 epsilon of temp" in below and "--target 2" in below, below


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_765_016_438_123, "2025-12-06T10:20:38.123Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (2**62, f"{2**62} ms (Unix)"),
    ],
)
def test_times_read_in_utc(ms: int, text: str) -> None:
    assert utc_text(ms) == text
