"""The market's trust root: which record of ``<p>.market`` is the market's identity, and what a
reader does with it (docs/protocol.md §12.1.1). The worker and the clients decide with these two
functions, so they never disagree on which record is the root.

The root is the first record of partition 0, *whatever it is*. Skipping records that are not an
identity would buy nothing: a stranger who can write a null or garbage record before the first
worker can as well write a valid-looking identity with his own key, and readers that skip
would then disagree with no error at all. So a root that is not a valid identity spoils the market
loudly (the worker refuses to start, clients refuse to trust it), and what protects against a
valid-looking foreign identity is the key a client is given (pinned), checked against the root.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any, Literal

from pydantic import ValidationError

from .events import MarketIdentity

__all__ = ["RootError", "RootReason", "read_root", "root_verdict", "trusted_key"]

RootReason = Literal["tombstone", "malformed", "foreign", "no_key"]
"""Why a root is refused: a null value; not a market identity; another key than the pinned one;
no key published and none pinned."""

_REMEDY = (
    "The first record of this topic is the market's identity for as long as the topic exists: "
    "someone wrote this one before the market's first worker did. If this market has served "
    "nothing yet, delete the topic {topic} (or the broker's data) and start the worker again; "
    "else choose another prefix; and let only the market's workers write to {topic} (ACLs, "
    "docs/operations.md)"
)


class RootError(ValueError):
    """The root of ``<p>.market`` cannot be trusted; ``reason`` is one of :data:`RootReason`."""

    def __init__(self, reason: RootReason, message: str) -> None:
        super().__init__(message)
        self.reason: RootReason = reason
        self.message = message


def read_root(topic: str, offset: int, value: bytes | None) -> MarketIdentity:
    """The market's identity from the root record (partition 0, ``offset``, ``value``).

    Raises
    ------
    RootError
        ``tombstone`` for a null value; ``malformed`` for anything that is not a market
        identity (docs/schemas/market.schema.json) whose ``market_key_id`` is the id of its
        ``market_public_key``.
    """
    where = f"the first record of {topic} (partition 0, offset {offset})"
    remedy = _REMEDY.format(topic=topic)
    if value is None:
        raise RootError(
            "tombstone",
            f"{where} is a tombstone (a null value), not the market's "
            f"identity: this market's trust root is spoiled. {remedy}",
        )
    try:
        ident = MarketIdentity.model_validate_json(value)
    except ValidationError as exc:
        raise RootError(
            "malformed",
            f"{where} is not a market identity ({len(value)} bytes: "
            f"{_first_error(exc)}): this market's trust root is "
            f"spoiled. {remedy}",
        ) from None
    if ident.market_public_key is not None:
        own = _id_of(ident.market_public_key)
        if own != ident.market_key_id:
            raise RootError(
                "malformed",
                f"{where} names key id {ident.market_key_id} for a key "
                f"whose id is {own}: this market's trust root is "
                f"spoiled. {remedy}",
            )
    return ident


def trusted_key(topic: str, ident: MarketIdentity, pinned: str | None) -> str:
    """The market key a client trusts, given the root's identity and the key it was given.

    Raises
    ------
    RootError
        ``foreign`` if the root publishes another key than ``pinned``; ``no_key`` if it
        publishes none and none is pinned.
    """
    published = ident.market_public_key
    if pinned is not None:
        if published is not None and _raw(published) != _raw(pinned):
            raise RootError(
                "foreign",
                f"the first record of {topic} names the market key {ident.market_key_id} "
                f"({published}), not the key this client was given ({_id_of(pinned)}, "
                f"{pinned}): this is not the market you pinned, or someone wrote its identity "
                "before its first worker did. Check the prefix and broker, and the key the "
                "market's operators published",
            )
        return pinned
    if published is None:
        raise RootError(
            "no_key",
            f"{topic} publishes no market key (a market made before answers "
            "were signed): pass the market's key (market_public_key in the "
            "catalog)",
        )
    return published


def root_verdict(topic: str, value: bytes | None, pinned: str | None) -> dict[str, Any]:
    """What a client concludes from a root record: ``{"verdict": "trusted"|"pinned"|reason,
    "key": ...}``: the form of the vectors of docs/protocol.md §12.1.1."""
    try:
        key = trusted_key(topic, read_root(topic, 0, value), pinned)
    except RootError as exc:
        return {"verdict": exc.reason, "key": None}
    return {"verdict": "trusted" if pinned is None else "pinned", "key": key}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def _raw(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text.encode()


def _id_of(text: str) -> str:
    """The key id of a base64 key (docs/protocol.md §5), computed as a reader would."""
    return hashlib.sha256(_raw(text)).hexdigest()[:16]
