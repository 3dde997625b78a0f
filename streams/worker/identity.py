"""The market's identity: a worker refuses to start with a noise secret its state was not made with.

Every release is a pure function of the noise secret (:mod:`market.chain`). A worker started with
another secret — or one implementing another noise format — would compute *different* noise for
levels already released, which is exactly the re-noising the market promises never to do. So the
first worker of a market writes a :class:`~streams.wire.events.MarketIdentity` (the secret's
fingerprint, the noise format and its known-answer digests) to ``<p>.market``, and every worker
reads the topic's **first** record before it starts: if it does not match, the worker stops with
an error saying what differs and what to do. Two workers starting at once on an empty market both
write; the earlier record wins and the other refuses.

Noise format v2 draws the same bytes on every machine (``docs/protocol.md`` §1), so the digests
are constants of the format: a market moves between CPUs, operating systems and numpy versions
freely. A market made with noise format v1 (whose bytes depended on the CPU's SIMD path) is
refused, not served: this version no longer has v1's samplers, and serving it with v2's would
re-noise every level it sold.

The record also names the format of the authenticators on the market's state records
(``state_format``, :mod:`streams.worker.state_records`). A market made before them has changelogs
whose records carry none: a worker of this version would refuse every one of them as forged and
start empty, so it refuses to start instead, saying so (there is no migration: signing the old
records now would vouch for whatever a stranger had appended to them).

The record also publishes the market's Ed25519 public key (``market_public_key``), which signs
receipts and every answer (docs/protocol.md §12): clients that were not
given the key learn it here, and a worker holding another signing key refuses to start, since
clients would refuse everything it signed.

Streams' registrations carry the same fingerprint (``Registered.secret_fingerprint``), a second
line of defence the core checks on every event.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiokafka import AIOKafkaProducer

from market.chain import DOMAIN, FORMAT, noise_check
from market.histogram_chain import noise_check_histogram

from ..broker.first_record import first_record
from ..core import MarketKeys
from ..wire.events import MarketIdentity
from ..wire.root import RootError, read_root
from ..wire.topics import Topics
from .state_records import FORMAT as STATE_FORMAT

__all__ = ["MarketIdentityError", "check_identity", "identity_of"]

log = logging.getLogger("emarket.worker")


class MarketIdentityError(RuntimeError):
    """This worker's noise secret or platform does not match the market's state."""


def identity_of(keys: MarketKeys, topics: Topics | None = None) -> MarketIdentity:
    """What this worker would write as the market's identity (with ``topics``' inbox layout:
    a v2 market records it, docs/protocol.md §8.5.1)."""
    v2 = topics is not None and topics.inboxes == 2
    return MarketIdentity(
        noise_secret_fingerprint=keys.noise_fingerprint,
        noise_derivation=DOMAIN.decode(),
        noise_format=FORMAT,
        noise_check=noise_check(),
        noise_check_histogram=noise_check_histogram(),
        state_format=STATE_FORMAT,
        market_key_id=keys.key_id,
        market_public_key=keys.public_key_b64,
        inboxes=2 if v2 else None,
        inbox_partitions=topics.inbox_partitions if v2 and topics is not None else None,
        market_sealing_key=keys.sealing_public_b64 if v2 else None,
        created_at_ms=time.time_ns() // 1_000_000,
    )


async def check_identity(
    bootstrap: str, topics: Topics, keys: MarketKeys, *, timeout: float = 30.0, **auth: Any
) -> MarketIdentity:
    """Claim the market for this worker's secret, or check it matches; raise if it does not.

    The market's identity is its trust root, the first record of partition 0 of ``<p>.market``
    whatever it is (:mod:`streams.wire.root`): one that is not a valid identity spoils the
    market, and the worker refuses to start, naming the record."""
    ours = identity_of(keys, topics)
    topic = topics.identity
    first = await _first_record(bootstrap, topic, timeout, auth)
    if first is None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **auth)
        await producer.start()
        try:
            await producer.send_and_wait(topic, ours.model_dump_json().encode(), partition=0)
        finally:
            await producer.stop()
        first = await _first_record(bootstrap, topic, timeout, auth)
        if first is None:
            raise MarketIdentityError(f"wrote the market identity to {topic} but cannot read it")
    try:
        theirs = read_root(topic, *first)
    except RootError as exc:
        raise MarketIdentityError(exc.message) from None
    _compare(ours, theirs, topic)
    return theirs


async def _first_record(
    bootstrap: str, topic: str, timeout: float, auth: dict[str, Any]
) -> tuple[int, bytes | None] | None:
    try:
        return await first_record(bootstrap, topic, timeout=timeout, wait_for_one=False, **auth)
    except TimeoutError:
        raise MarketIdentityError(f"could not read {topic} within {timeout}s") from None


def _compare(ours: MarketIdentity, theirs: MarketIdentity, topic: str) -> None:
    if theirs.noise_secret_fingerprint != ours.noise_secret_fingerprint:
        raise MarketIdentityError(
            f"this worker's noise secret (fingerprint {ours.noise_secret_fingerprint}) is not the "
            f"one this market's state was made with ({theirs.noise_secret_fingerprint}, recorded "
            f"in {topic}); starting would re-noise levels already released. Start it with the "
            "market's EMARKET_NOISE_SECRET (or its data directory), or use a new --prefix for a "
            f"new market. {_written_by_someone_else(topic)}"
        )
    if theirs.noise_format != ours.noise_format:
        made = f"noise format v{theirs.noise_format or 1}"
        raise MarketIdentityError(
            f"this market was made with {made} (recorded in {topic}); this worker draws noise "
            f"format v{ours.noise_format}, which gives other bytes for the same request, so "
            "serving it would re-noise every level already sold. Start a new market with a new "
            "--prefix (its accounts, streams and holdings do not carry over), or keep serving "
            "this one with the epsilon-market release that made it (0.1.x for format v1)"
        )
    if theirs.state_format != ours.state_format:
        _refuse_state_format(ours, theirs, topic)
    if theirs.market_public_key is not None and theirs.market_public_key != ours.market_public_key:
        raise MarketIdentityError(
            f"this worker's signing key ({ours.market_key_id}) is not this market's "
            f"({theirs.market_key_id}, recorded in {topic}); clients believe only answers and "
            "receipts signed by the market's key, so every one this worker signed would be "
            "refused as forged. Start it with the market's EMARKET_SIGNING_KEY (or its data "
            f"directory). {_written_by_someone_else(topic)}"
        )
    _compare_inboxes(ours, theirs, topic)
    checks = [
        ("derivation", ours.noise_derivation, theirs.noise_derivation),
        ("check", ours.noise_check, theirs.noise_check),
        ("histogram check", ours.noise_check_histogram, theirs.noise_check_histogram),
    ]
    differ = [
        f"{which} {str(a)[:16]} vs {str(b)[:16]}"
        for which, a, b in checks
        if b is not None and a != b
    ]
    if differ:
        raise MarketIdentityError(
            f"this worker derives other noise from the same key than the one that made this "
            f"market's state ({'; '.join(differ)}, this worker's first), under the same noise "
            "format: one of the two implementations is wrong (docs/protocol.md §1.7 states the "
            "format's check). Report it; do not serve this market with this worker"
        )


def _inbox_settings(identity: MarketIdentity) -> str:
    if identity.inboxes == 2:
        return f"EMARKET_INBOXES=v2 EMARKET_INBOX_PARTITIONS={identity.inbox_partitions}"
    return "EMARKET_INBOXES=v1"


def _compare_inboxes(ours: MarketIdentity, theirs: MarketIdentity, topic: str) -> None:
    """Refuse a worker whose inbox layout is not the one the market was made with: its
    answers would go where the market's readers do not look (docs/protocol.md §8.5.1)."""
    if (ours.inboxes, ours.inbox_partitions) == (theirs.inboxes, theirs.inbox_partitions):
        return
    raise MarketIdentityError(
        f"this market was made with {_inbox_settings(theirs)} (recorded in {topic}); this "
        f"worker was started with {_inbox_settings(ours)}, and its answers would go where the "
        f"market's clients do not read. Start it with {_inbox_settings(theirs)}; a market's "
        "inbox layout cannot change (docs/operations.md)"
    )


def _written_by_someone_else(topic: str) -> str:
    return (
        f"If this market is new and has never served, someone else wrote the first record "
        f"of {topic} before its first worker did (docs/protocol.md §12.1.1): delete that "
        "topic and start again, and let only the market's workers write to it"
    )


def _refuse_state_format(ours: MarketIdentity, theirs: MarketIdentity, topic: str) -> None:
    if theirs.state_format is None:
        raise MarketIdentityError(
            f"this market's state was written without authenticators (recorded in {topic}: no "
            f"state_format); this worker applies only state records that carry the market's "
            f"(state format v{ours.state_format}, docs/protocol.md §3) and would refuse all of "
            "them as forged. Start a new market with a new --prefix (its accounts, streams and "
            "holdings do not carry over), or keep serving this one with the epsilon-market "
            "release that made it"
        )
    raise MarketIdentityError(
        f"this market's state records are of state format v{theirs.state_format} (recorded in "
        f"{topic}); this worker reads v{ours.state_format} (sealed, versioned records committed "
        "by checkpoints, docs/protocol.md §3). There is no migration: vouching now for the old "
        "records would vouch for whatever was appended to them. Start a new market with a new "
        "--prefix (its accounts, streams and holdings do not carry over), or keep serving this "
        "one with the epsilon-market release that made it"
    )
