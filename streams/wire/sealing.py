"""Releases sealed for one buyer: the one place that says what is sealed and under which AAD.

A buyer who names an X25519 key gets its releases as an envelope (:mod:`market.envelope`)
instead of plain numbers. The envelope's plaintext is the JSON list of :class:`ReleasedValue`
and its associated data (AAD) binds the envelope to the event carrying it, so an envelope cannot
be moved from one event to another without failing to open:

==========================  ===========================================
event                       AAD
==========================  ===========================================
``purchase_fulfilled``      ``purchase_id``
``value_released``          ``stream_id/buyer_id``
==========================  ===========================================

The worker seals with :func:`seal_releases`, clients open with :func:`open_event`; both use
:func:`aad_of`, so the rule cannot drift between them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeVar, cast

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pydantic import BaseModel, TypeAdapter

from market.envelope import Sealer, open_envelope

from .events import Envelope, PurchaseFulfilled, ReleasedValue, ValueReleased

__all__ = [
    "aad_of",
    "delivery_aad",
    "open_event",
    "padded",
    "purchase_aad",
    "releases_json",
    "seal_releases",
]

E = TypeVar("E", bound=BaseModel)
_RELEASES: TypeAdapter[list[ReleasedValue]] = TypeAdapter(list[ReleasedValue])


def purchase_aad(purchase_id: str) -> bytes:
    """AAD of the envelope in a ``purchase_fulfilled`` event."""
    return purchase_id.encode()


def delivery_aad(stream_id: str, buyer_id: str) -> bytes:
    """AAD of the envelope in a ``value_released`` event."""
    return f"{stream_id}/{buyer_id}".encode()


def aad_of(event: PurchaseFulfilled | ValueReleased) -> bytes:
    """The associated data an envelope carried by ``event`` is sealed under."""
    if isinstance(event, PurchaseFulfilled):
        return purchase_aad(event.purchase_id)
    return delivery_aad(event.stream_id, event.buyer_id)


def releases_json(releases: Sequence[ReleasedValue]) -> bytes:
    """The plaintext of an envelope: the releases as a JSON list."""
    return _RELEASES.dump_json(list(releases))


PAD_MIN = 1024


def padded(plaintext: bytes) -> bytes:
    """A histogram release's plaintext padded with spaces (valid trailing JSON whitespace) to
    the next power of two, at least :data:`PAD_MIN` bytes: how many keys a buyer was sent
    shows in its envelope's size only to within a factor of two."""
    size = max(PAD_MIN, 1 << (len(plaintext) - 1).bit_length())
    return plaintext + b" " * (size - len(plaintext))


def seal_releases(
    sealer: Sealer, public_key_b64: str, releases: Sequence[ReleasedValue], aad: bytes
) -> Envelope:
    """Seal ``releases`` for the holder of ``public_key_b64`` under ``aad`` (see :func:`aad_of`).

    Histogram releases are :func:`padded` first. The ``sealer`` (:class:`market.envelope.Sealer`,
    over the market's noise secret) keeps a sender key per buyer and derives each envelope's
    nonce from the buyer, the AAD and the plaintext: the same message is sealed into the same
    bytes every time it is produced (replays stay byte-identical), and two different messages
    never share a nonce.
    """
    plaintext = releases_json(releases)
    if any(r.keys is not None for r in releases):
        plaintext = padded(plaintext)
    return Envelope.model_validate(sealer.seal(public_key_b64, plaintext, aad))


def open_event(event: E, key: X25519PrivateKey) -> E:
    """``event`` with its sealed releases opened (any other event is returned unchanged).

    Raises :class:`market.envelope.EnvelopeError` if ``key`` cannot open it.
    """
    if not isinstance(event, PurchaseFulfilled | ValueReleased) or event.sealed is None:
        return event
    plain = open_envelope(key, event.sealed.model_dump(), aad=aad_of(event))
    releases = [ReleasedValue.model_validate(r) for r in json.loads(plain)]
    return cast(E, event.model_copy(update={"releases": releases}))
