"""A seller's registration → the stream's state and its catalog entry.

A registration is signed by the seller's account, which then alone can publish into the stream.
It is accepted once: resending the identical registration re-emits the catalog entry; the same
stream id with other parameters is refused (``stream_exists``). What was accepted
(:class:`~.state.Registered`) is therefore fixed for good, and stored once, apart from the
stream's record (:mod:`.stream_store`). The mechanism, the price
schedule (no step may cost less than nothing) and the size of the largest purchase outcome (it
must fit in one message) are checked before anything is stored.
"""

from __future__ import annotations

from market.pricing import price_list, sellable_levels

from ..wire.events import UNIT_OF, CatalogEntry, PriceLevel, StreamRegistration
from .accuracy import randomized_response
from .answering import sign_published
from .context import Context
from .delivery import release_bytes
from .incoming import Incoming
from .outputs import Outcome, Output, Reject, dump
from .products import product_class
from .quotas import check_registration
from .state import Registered, StreamState, registered_bound, stream_record_bound
from .stream_store import Streams
from .terms import Terms, terms_of

__all__ = ["EPSILON_DELTA", "entry_again", "register"]

EPSILON_DELTA = 1e-6
"""δ at which catalog entries state ε for Gaussian and Poisson streams."""


def _price_levels(reg: StreamRegistration, terms: Terms) -> list[PriceLevel]:
    """Each level for sale as the catalog lists it: its price, its ε, and on a stream of bit
    reports each bit's randomized response."""
    prices = price_list(
        terms.schedule,
        terms.mechanism,
        list(reg.steps),
        reg.cap,
        dimension=reg.dimension,
        delta=EPSILON_DELTA,
    )
    return [
        PriceLevel(
            level=p.level,
            price_minor=p.price_minor,
            epsilon=p.epsilon,
            randomized_response=randomized_response(reg, p.level),
        )
        for p in prices
    ]


def register(ctx: Context, streams: Streams, inc: Incoming[StreamRegistration]) -> Outcome:
    """Apply one ``register_stream`` event: a new stream, or its catalog entry again."""
    reg = inc.event
    existing = streams.registered(reg.stream_id)
    if existing is not None:
        return _again(ctx, reg, existing)
    check_registration(reg)  # a share that leaves a buyer nothing to buy
    # every check before a histogram stream's survival law, the one costly part, is built
    _check_purchase_cost(ctx, reg, len(sellable_levels(reg.steps, reg.cap)))
    ctx.census.check_room(reg, ctx.limits.stream_quota)
    terms = terms_of(reg)
    for level in terms.levels:  # every level for sale can be released
        terms.mechanism.check_level(level)
    terms.schedule.validate(terms.mechanism, list(reg.steps), reg.cap)
    now = ctx.clock()
    payload = dump(
        CatalogEntry(
            registration=reg,
            level_unit=UNIT_OF[reg.mechanism],
            accepted_at_ms=now,
            market_key_id=ctx.keys.key_id,
            market_public_key=ctx.keys.public_key_b64,
            market_sealing_key=ctx.keys.sealing_public_b64,
            prices=_price_levels(reg, terms),
        )
    )
    _check_record_size(ctx, reg, len(payload))
    streams.create(
        StreamState(
            registered=Registered(
                registration=reg,
                secret_fingerprint=ctx.keys.noise_fingerprint,
                accepted_at_ms=now,
                catalog_payload=payload.decode(),
            ),
            # purchases older than the horizon before it were refused by the clock: the watermark
            # keeps refusing them on every worker, whatever its clock
            purchase_watermark_ms=now,
        ),
        terms,
    )
    ctx.census.added(reg)
    return Outcome(
        "registration",
        "accepted",
        [Output(ctx.topics.catalog, reg.stream_id.encode(), payload)],
        stream_id=reg.stream_id,
        mechanism=reg.mechanism,
    )


def _again(ctx: Context, reg: StreamRegistration, existing: Registered) -> Outcome:
    """A registration of a stream id already taken: a resend re-emits its catalog entry."""
    if existing.registration != reg:
        raise Reject(
            "stream_exists",
            f"stream {reg.stream_id!r} is already registered by "
            f"{existing.registration.seller_id!r} with different parameters; register a new "
            "stream id instead",
        )
    entry = existing.catalog_payload.encode()
    return Outcome(
        "registration",
        "duplicate",
        [Output(ctx.topics.catalog, reg.stream_id.encode(), entry)],
        stream_id=reg.stream_id,
        mechanism=reg.mechanism,
    )


def entry_again(ctx: Context, registered: Registered) -> Output:
    """A registered stream's catalog entry, to publish again when the catalog lost it (anyone
    may delete or empty a topic on the embedded broker): the bytes accepted at registration,
    kept for good in ``registered``, signed for the catalog alone (no event asked for it)."""
    reg = registered.registration
    entry = Output(ctx.topics.catalog, reg.stream_id.encode(), registered.catalog_payload.encode())
    return sign_published(ctx, entry)


def _check_record_size(ctx: Context, reg: StreamRegistration, catalog_bytes: int) -> None:
    """The stream's records must always fit in one message each, however full it gets."""
    record = max(
        stream_record_bound(
            reg.retain_last,
            ctx.limits.max_holders,
            windowed=reg.window is not None,
            shared=reg.window is not None and reg.buyer_share is not None,
        ),
        registered_bound(catalog_bytes),
    )
    if record > ctx.limits.max_message_bytes:
        raise Reject(
            "stream_too_large",
            f"this stream's record (window of {reg.retain_last}, up to "
            f"{ctx.limits.max_holders} holders, a {catalog_bytes}-byte catalog entry) may take "
            f"{record} bytes, but a message may have at most {ctx.limits.max_message_bytes}; "
            "lower retain_last or shorten the description and price table",
        )


def _check_purchase_cost(ctx: Context, reg: StreamRegistration, levels: int) -> None:
    """A purchase returns the whole window, drawn up the whole chain: both must stay bounded."""
    worst = reg.retain_last * release_bytes(reg.release_width(), sealed=True) + 8192
    if worst > ctx.limits.max_message_bytes:
        raise Reject(
            "stream_too_large",
            f"a purchase of this stream returns {reg.retain_last} values of {reg.dimension} "
            f"numbers, up to {worst} bytes, but a message may have at most "
            f"{ctx.limits.max_message_bytes}; lower retain_last or the dimension",
        )
    product = product_class(reg)
    work = ctx.limits.work(
        product.chains_walked(reg, reg.retain_last), levels, product.work_width(reg)
    )
    if work > ctx.limits.max_event_work:
        raise Reject(
            "stream_too_large",
            f"a purchase at the top of this stream walks {reg.retain_last} values of "
            f"{reg.dimension} numbers up {levels} levels ({work} work units), more than one "
            f"event may cost ({ctx.limits.max_event_work}); lower retain_last, the dimension "
            "or the number of steps",
        )
