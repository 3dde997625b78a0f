"""An input event once the router has read it: parsed, its sender proven, on its partition.

The router does these three things once for every event (:mod:`streams.core.router`); a handler
receives the result and never repeats them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ..wire.events import AccountState
from .rejections import Source

__all__ = ["Incoming"]

E = TypeVar("E")


@dataclass(frozen=True)
class Incoming(Generic[E]):
    """A parsed event (``E``: its wire model), the account that proved it sent it, and where it
    came from (topic, partition, offset, raw bytes: what a rejection of it quotes)."""

    event: E
    account: AccountState
    src: Source
