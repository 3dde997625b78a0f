"""What a buyer's request buys: the level it names, the step from what it holds, and the price.

A purchase and a quote plan alike; a quote stops here. A request names its level explicitly, as
an accuracy (the cheapest level that meets it), or as "the most accurate level my price buys";
without any, it buys the next step above what the buyer holds.
"""

from __future__ import annotations

from typing import Any

from market.accuracy import AccuracyNotForSaleError, cheapest_level
from market.pricing import StepPlan, plan_step

from ..wire.events import Offer, PurchaseRequest, QuoteRequest, ReserveRequest
from .accuracy import offer_accuracy, randomized_response, threshold
from .ledger import buyer_share, reserved_room, window_room
from .outputs import Reject
from .products import Product
from .stream import Stream

__all__ = ["offers", "plan", "target"]


def target(
    stream: Stream[Product], buyer_id: str, req: PurchaseRequest | QuoteRequest | ReserveRequest
) -> float | None:
    """The level a request names; ``None`` for the next step."""
    if req.accuracy is None and not getattr(req, "most_accurate", False):
        return req.target_level
    if req.accuracy is not None:
        return _for_accuracy(stream, req)
    held = stream.held(buyer_id)
    budget = req.max_price_minor if isinstance(req, PurchaseRequest) else 0
    above = [lv for lv in stream.terms.levels if lv > held]
    fits = stream.ledger.fitting_purchase(
        [stream.ledger.level(lv) for lv in above],
        fresh=buyer_id not in stream.state.holders,
        buyer_id=buyer_id,
    )
    price = stream.terms.schedule.step_price
    mech = stream.terms.mechanism
    affordable = [
        lv for lv, ok in zip(above, fits, strict=True) if ok and price(mech, held, lv) <= budget
    ]
    if affordable:
        return max(affordable)
    # nothing affordable: the next level up is refused as too dear (saying what it costs);
    # nothing above at all: the next step is refused as "no higher step"
    return above[0] if above else None


def _for_accuracy(
    stream: Stream[Product], req: PurchaseRequest | QuoteRequest | ReserveRequest
) -> float:
    """The cheapest level whose error meets the request's accuracy (on running totals, for the
    least accurate total)."""
    reg = stream.registration
    acc = req.accuracy
    assert acc is not None
    per = type(stream.product).error_factor(reg)
    rmse = None if acc.rmse is None else acc.rmse / per
    hw = None if acc.half_width is None else acc.half_width / per
    try:
        return cheapest_level(
            stream.terms.mechanism,
            list(stream.terms.levels),
            rmse=rmse,
            half_width=hw,
            confidence=acc.confidence,
        )
    except AccuracyNotForSaleError as exc:
        msg = type(stream.product).accuracy_refusal(reg, exc)
        raise Reject(
            "accuracy_not_for_sale", msg, best_level=exc.best, best_error=exc.error * per
        ) from None
    except ValueError as exc:  # a target the model cannot meet at all (wire-validated)
        raise Reject("invalid_event", f"accuracy target: {exc}") from None


def plan(stream: Stream[Any], buyer_id: str, level: float | None) -> StepPlan:
    """The step from what ``buyer_id`` holds to ``level`` (``None``: the next step), priced."""
    reg = stream.registration
    terms = stream.terms
    return plan_step(
        terms.schedule,
        terms.mechanism,
        list(reg.steps),
        reg.cap,
        stream.held(buyer_id),
        level,
        stream=reg.stream_id,
    )


def offers(stream: Stream[Product], buyer_id: str, held: float) -> list[Offer]:
    """Every level for sale with its accuracy and what it costs ``buyer_id`` from ``held``
    (which fit the windows: the room its own reservation holds is its to use)."""
    reg = stream.registration
    terms = stream.terms
    levels = list(terms.levels)
    window = reg.window is not None
    factor = type(stream.product).error_factor(reg)  # running totals: the least accurate total's
    # a level at or below the one held is answered with the held level's release
    ledger = stream.ledger
    asked = [ledger.level(max(lv, held)) for lv in levels]
    fits = ledger.fitting_purchase(asked, (window_room, reserved_room), buyer_id=buyer_id)
    # a buyer that holds nothing (held 0: levels are at least 10⁻⁹) will have had only the
    # retained values of each window, which its share counts
    in_share = ledger.fitting_purchase(asked, (buyer_share,), fresh=held == 0.0)
    shared = reg.buyer_share is not None
    out = []
    for lv, ok, mine in zip(levels, fits, in_share, strict=True):
        rmse, hw95 = offer_accuracy(reg.mechanism, reg.release_sensitivity(), reg.dimension, lv)
        price = terms.schedule.step_price(terms.mechanism, held, lv) if lv > held else 0
        out.append(
            Offer(
                level=lv,
                rmse=rmse * factor,
                half_width_95=hw95 * factor,
                price_minor=price,
                held=lv <= held,
                fits_window=ok if window else None,
                fits_share=mine if shared else None,
                threshold=threshold(reg, lv),
                randomized_response=randomized_response(reg, lv),
            )
        )
    return out
