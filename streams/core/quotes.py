"""A buyer's quote: what a purchase would cost and buy, without buying.

The answer lists every level for sale with its accuracy, its price from what the buyer holds and
whether a privacy window has room for it, and the level a purchase with the same terms would
buy. A quote changes nothing: it is answered, never recorded. Its answer is many times its
request, so each account may ask a bounded number of quotes a minute
(:class:`~.allowance.Allowance`, :attr:`~.context.Limits.max_quotes_per_minute`); beyond that a
quote is refused (``rate_limited``) with the time to wait. A quote has an age limit, and a copy
of one already decided is answered nowhere and spends nothing (:mod:`.replay.quotes`): anyone
can write a buyer's signed quote again, and must not fill the buyer's inbox or allowance with it.
"""

from __future__ import annotations

from market.errors import NoHigherStepError
from market.pricing import StepPlan

from ..wire.events import UNIT_OF, QuoteAnswer, QuoteRequest
from .accuracy import error_info
from .context import Context
from .incoming import Incoming
from .ledger import latest_status
from .outputs import Outcome, Output, Reject, dump
from .planning import offers, plan, target
from .rejections import rejection
from .stream_store import Streams

__all__ = ["quote"]


def quote(ctx: Context, streams: Streams, inc: Incoming[QuoteRequest]) -> Outcome:
    """Answer what a purchase would cost, without buying."""
    req = inc.event
    try:
        first = ctx.quotes.admit(req.buyer_id, req.quote_id, req.requested_at_ms)
    except Reject as stale:  # no inbox: a stale copy may be anyone's (.replay.quotes)
        return rejection(ctx, "quote", inc.src, stale)
    if not first:
        return Outcome("quote", "duplicate", reason="already_answered", stream_id=req.stream_id)
    ctx.allowance.quote(req.buyer_id)  # before any work: an answer is ~29x its request
    stream = streams.load(req.stream_id)
    level = target(stream, req.buyer_id, req)
    try:
        step = plan(stream, req.buyer_id, level)
    except NoHigherStepError:  # the top step is held: the quote still lists what is for sale
        held = stream.held(req.buyer_id)
        step = StepPlan(held, held, held, 0)
    reg = stream.registration
    answer = QuoteAnswer(
        quote_id=req.quote_id,
        buyer_id=req.buyer_id,
        stream_id=req.stream_id,
        level_unit=UNIT_OF[reg.mechanism],
        level_before=step.held,
        level_after=step.after,
        price_minor=step.price_minor,
        currency=reg.currency,
        error_model=error_info(reg, step.after),
        offers=offers(stream, req.buyer_id, step.held),
        privacy_window=latest_status(stream.state),
    )
    return Outcome(
        "quote",
        "answered",
        [Output(ctx.topics.inbox(req.buyer_id), req.quote_id.encode(), dump(answer))],
        stream_id=req.stream_id,
        price_minor=step.price_minor,
    )
