"""A seller's registration → the stream's state and its catalog entry.

A registration is accepted once: resending the identical registration re-emits the catalog
entry; the same stream id with other parameters is refused (``stream_exists``). The mechanism
and price schedule are validated before anything is stored.
"""

from __future__ import annotations

from market.pricing import price_list

from ..wire.events import UNIT_OF, CatalogEntry, PriceLevel, StreamRegistration
from .context import Context
from .outputs import Outcome, Output, Reject, dump
from .state import StreamState

__all__ = ["EPSILON_DELTA", "register"]

EPSILON_DELTA = 1e-6
"""δ at which catalog entries state ε for Gaussian and Poisson streams."""


def register(ctx: Context, raw: bytes) -> Outcome:
    """Apply one ``register_stream`` event."""
    reg = StreamRegistration.model_validate_json(raw)
    existing = ctx.stores.streams.get(reg.stream_id)
    if existing is not None:
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
    terms = ctx.terms(reg)
    terms.schedule.validate(terms.mechanism, list(reg.steps), reg.cap)
    prices = price_list(
        terms.schedule, terms.mechanism, list(reg.steps), reg.cap, dimension=reg.dimension,
        delta=EPSILON_DELTA,
    )  # fmt: skip
    now = ctx.clock()
    entry_model = CatalogEntry(
        registration=reg,
        level_unit=UNIT_OF[reg.mechanism],
        accepted_at_ms=now,
        market_key_id=ctx.keys.key_id,
        market_public_key=ctx.keys.public_key_b64,
        prices=[PriceLevel(level=p.level, price_minor=p.price_minor, epsilon=p.epsilon)
                for p in prices],
    )  # fmt: skip
    payload = dump(entry_model)
    ctx.stores.streams[reg.stream_id] = StreamState(
        registration=reg,
        secret_fingerprint=ctx.keys.noise_fingerprint,
        accepted_at_ms=now,
        catalog_payload=payload.decode(),
    )
    return Outcome(
        "registration",
        "accepted",
        [Output(ctx.topics.catalog, reg.stream_id.encode(), payload)],
        stream_id=reg.stream_id,
        mechanism=reg.mechanism,
    )
