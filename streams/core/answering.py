"""Signing what the market says to parties: the one place every inbox message and refusal is
made an answer (docs/protocol.md §12).

Handlers build their outputs as before; :class:`~streams.core.router.MarketCore` passes each
event's outcome through :func:`sign_outcome` and each batch's deliveries through
:func:`sign_deliveries`, so no handler can send an unsigned answer and none needs to know the
format. An outcome that refuses the event (a rejection for the operators) also gets its public
refusal record, keyed by the SHA-256 of the event's bytes: one small record per refused event,
beside the rejection every refused event already costs the market, so it opens no path to flood
anything an attacker could not flood before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from ..wire.answers import answer_header, refusal_value
from ..wire.events import Rejection
from .context import Context
from .outputs import Outcome, Output, dump
from .refusal_budget import Dropped

__all__ = ["DROPPED", "dropped_outputs", "sign_deliveries", "sign_outcome", "sign_published"]

DROPPED = "refusals_dropped"
"""The code of the summary of what was not answered on one partition in one interval."""

#: a notice that an outcome was already sent is not a refusal: the answer is in the inbox
_NOT_REFUSALS = frozenset({"already_answered"})


def _signed(ctx: Context, out: Output, request: str | None) -> Output:
    header = answer_header(ctx.keys.signing_key, ctx.topics.prefix, out.topic, request, out.value)
    return dataclasses.replace(out, headers=(*out.headers, header))


def _reason_of(rejection: bytes) -> str:
    """The reason code of a rejection the core built (its own bytes, small and valid)."""
    try:
        code = json.loads(rejection).get("reason")
    except (ValueError, AttributeError):
        code = None
    return code if isinstance(code, str) else "refused"


def sign_outcome(
    ctx: Context,
    outcome: Outcome,
    raw: bytes,
    topic: str,
    partition: int | None,
    offset: int | None,
) -> Outcome:
    """``outcome`` of the event ``raw`` (read from ``topic`` at ``partition``, ``offset``) with
    every inbox message and catalog entry signed as its answer (the catalog, too, is a topic
    anyone may write to on a broker without ACLs, and it names the key sellers seal their values
    to), and the event's refusal record added if it was refused. A message to someone else
    than the sender (``Output.answer`` False: a seller's sale notice) is signed for its inbox
    alone, as a delivery: it answers no request of its reader's.

    The refusal names the record refused: anyone can copy a sender's bytes to another topic or
    write them again, where they are refused under the same key, and the sender must not take
    that refusal for the one of the record it wrote (docs/protocol.md §12.5).

    With v2 inboxes (§8.5) the inbox messages are not signed one by one: each account's are
    sealed into one record signed once (:mod:`streams.core.inbox_records`)."""
    if not outcome.outputs:
        return outcome
    request = hashlib.sha256(raw).hexdigest()
    outputs: list[Output] = []
    sealed: list[tuple[Output, str | None]] = []
    refused: Output | None = None
    for out in outcome.outputs:
        if out.topic == ctx.topics.rejections and refused is None:
            refused = out
        if ctx.topics.inboxes == 2 and ctx.topics.is_inbox(out.topic):
            sealed.append((out, request if out.answer else None))
            continue
        signed = ctx.topics.is_inbox(out.topic) or out.topic == ctx.topics.catalog
        outputs.append(_signed(ctx, out, request if out.answer else None) if signed else out)
    outputs[:0] = ctx.inbox_records.records(sealed) if sealed else []
    if refused is not None:
        code = outcome.reason or _reason_of(refused.value)
        if code not in _NOT_REFUSALS:
            value = refusal_value(code, topic, partition, offset)
            record = Output(ctx.topics.refusals, request.encode(), value)
            outputs.append(_signed(ctx, record, request))
    outcome.outputs = outputs
    return outcome


def sign_deliveries(ctx: Context, outputs: list[Output]) -> None:
    """Sign a batch's subscription deliveries in place: each answers no single event (it
    gathers the releases of the batch's values), so it is bound to its inbox alone. With v2
    inboxes, one record per buyer carries all of the batch's deliveries to it (§8.5.4)."""
    if ctx.topics.inboxes == 2:
        inbox = [(o, None) for o in outputs if ctx.topics.is_inbox(o.topic)]
        rest = [o for o in outputs if not ctx.topics.is_inbox(o.topic)]
        outputs[:] = [*ctx.inbox_records.records(inbox), *rest]
        return
    outputs[:] = [_signed(ctx, o, None) if ctx.topics.is_inbox(o.topic) else o for o in outputs]


def sign_published(ctx: Context, out: Output) -> Output:
    """``out`` (a catalog entry published again from the market's state, which no event asked
    for) signed for its topic alone, as a delivery is: its bytes are those first published,
    and a reader believes them by the market's signature for the catalog."""
    return _signed(ctx, out, None)


def dropped_outputs(ctx: Context, d: Dropped) -> list[Output]:
    """The summary of the refusals not written for ``d``'s partition and interval
    (docs/protocol.md §9): a ``rejection`` with code ``refusals_dropped`` for the operators,
    its counts in ``details``, and a signed ``refusal`` with that code on ``<p>.refusals``
    (keyed by the partition: a sender whose bytes were read there, between the offsets named,
    learns why no refusal of its own came). Nothing of any event is quoted."""
    where = f"{d.topic}[{d.partition}]"
    b = ctx.limits.refusals
    message = (
        f"{d.total} events on {where} whose signature proved no account were not answered "
        f"one by one in the {b.interval_ms} ms from {d.start_ms}: {d.repeated} repeated bytes "
        f"already answered, {d.over_bound} over the bound of {b.per_interval} answers or "
        f"{b.bytes_per_interval} bytes per partition and interval; their codes are in details"
    )
    details = {
        "interval_start_ms": d.start_ms,
        "interval_ms": d.interval_ms,
        "repeated": d.repeated,
        "over_bound": d.over_bound,
        "reasons": dict(sorted(d.reasons.items())),
        "first_offset": d.first_offset,
        "last_offset": d.last_offset,
    }
    summary = Rejection(
        reason=DROPPED,
        message=message,
        source_topic=d.topic,
        source_partition=d.partition,
        source_offset=d.first_offset,
        payload="",
        payload_bytes=0,
        payload_sha256=hashlib.sha256().hexdigest(),
        details=details,
    )
    record = Output(
        ctx.topics.refusals,
        f"{DROPPED}.{where}".encode(),
        refusal_value(DROPPED, d.topic, d.partition, d.last_offset),
    )
    return [Output(ctx.topics.rejections, None, dump(summary)), _signed(ctx, record, None)]
