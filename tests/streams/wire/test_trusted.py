"""``trusted`` makes what ``model_construct`` makes, for every model the core builds with it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from streams.wire.events import (
    INBOX_EVENT,
    Envelope,
    PurchaseFulfilled,
    ReceiptModel,
    ReleasedValue,
    Sale,
    SaleItem,
    Sales,
    ValueBatch,
    ValueOutcome,
    ValueReleased,
    ValuesAccepted,
)
from streams.wire.sealing import open_values
from streams.wire.topics import Topics
from streams.wire.trusted import trusted

from ..helpers import MARKET, TEST_KEYS, market_core, purchase, registration, value, values

T = Topics(MARKET)
BUILT = {
    Envelope,
    PurchaseFulfilled,
    ReceiptModel,
    ReleasedValue,
    Sale,
    SaleItem,
    Sales,
    ValueBatch,
    ValueOutcome,
    ValueReleased,
    ValuesAccepted,
}
"""Every model the core makes with ``trusted``."""


def _same(a: BaseModel, b: BaseModel) -> None:
    assert type(a) is type(b)
    assert list(a.__dict__.items()) == list(b.__dict__.items())  # the same fields, in order
    assert a.model_fields_set == b.model_fields_set
    assert a.__pydantic_extra__ == b.__pydantic_extra__
    assert a.__pydantic_private__ == b.__pydantic_private__
    assert a.model_dump_json() == b.model_dump_json()


def _rebuilt(m: BaseModel, seen: set[type[BaseModel]]) -> None:
    """Rebuild ``m`` and every model inside it both ways, from the fields it was given."""
    seen.add(type(m))
    fields: dict[str, Any] = {k: getattr(m, k) for k in m.model_fields_set}
    _same(trusted(type(m), **fields), type(m).model_construct(**fields))
    for v in fields.values():
        for inner in v if isinstance(v, list) else [v]:
            if isinstance(inner, BaseModel):
                _rebuilt(inner, seen)


def test_the_market_s_own_events_rebuild_alike() -> None:
    """The inbox events a market makes (a purchase sealed and in clear, a delivery, a seller's
    answer with a refusal, a sale), parsed and rebuilt from their fields both ways."""
    c = market_core("seller1", "alice", "sealed_bob")
    c.handle(T.registrations, registration("s"))
    outs = [c.handle(T.values, value("s", "v0", [1.0, 2.0, 3.0]))]
    outs += [
        c.handle(T.purchases, purchase("s", who, who, target_level=1.0))
        for who in ("alice", "sealed_bob")
    ]
    outs.append(c.handle(T.values, values("s", [("v1", [4.0, 5.0, 6.0]), ("v2", [1.0])])))
    seen: set[type[BaseModel]] = set()
    for out in outs:
        for o in out.outputs:
            if o.topic.startswith(T.inbox("")):
                ev = INBOX_EVENT.validate_json(o.value)
                _rebuilt(ev, seen)
                for sale in ev.each() if isinstance(ev, Sales) else []:
                    _rebuilt(sale, seen)  # what a reader makes of a notice's sales
    sealed = ValueBatch.model_validate_json(values("s", [("v3", [1.0, 2.0, 3.0])]))
    opened = open_values(sealed, MARKET, TEST_KEYS.opener)  # the router's, one per batch
    _same(opened, sealed.model_copy(update={"items": opened.items, "sealed": None}))
    seen.add(ValueBatch)
    assert seen >= BUILT, BUILT - seen


def test_defaults_are_filled_and_mistakes_refused() -> None:
    r = trusted(ReleasedValue, value_id="v", seq=0, level=1.0, values=[1.0])
    _same(r, ReleasedValue.model_construct(value_id="v", seq=0, level=1.0, values=[1.0]))
    a = trusted(ValueReleased, buyer_id="b", stream_id="s", level_unit="epsilon")
    b = trusted(ValueReleased, buyer_id="b", stream_id="s", level_unit="epsilon")
    assert a.releases == [] and a.releases is not b.releases  # a factory's default, each its own
    with pytest.raises(TypeError, match=r"missing \['seq'\]"):
        trusted(ReleasedValue, value_id="v", level=1.0, values=[1.0])
    with pytest.raises(TypeError, match=r"unknown \['valus'\]"):
        trusted(ReleasedValue, value_id="v", seq=0, level=1.0, valus=[1.0])


class _Aliased(BaseModel):
    x: int = Field(alias="y")


class _Shared(BaseModel):
    model_config = ConfigDict(extra="forbid")
    xs: list[int] = []


@pytest.mark.parametrize("cls", [_Aliased, _Shared])
def test_a_model_it_would_build_otherwise_is_refused(cls: type[BaseModel]) -> None:
    with pytest.raises(TypeError, match=r"model_construct|factory"):
        trusted(cls, xs=[1]) if cls is _Shared else trusted(cls, y=1)
