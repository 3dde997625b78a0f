"""Accounts: who may act as whom. Opening pins keys to an id; rotating replaces them.

Every seller and buyer is an account with an Ed25519 signing key (every event it sends is
signed with it) and, for buyers, an X25519 sealing key (every release to it is sealed for it).

* ``open_account`` is signed with the key it pins (proof of possession). The first valid one for
  an id wins; resending it is harmless; another key for a taken id is refused. A market that
  opens by invitation (``Limits.openings``) also wants the operators' invitation for the id
  (:mod:`streams.wire.invitations`). Openings are rate-limited per input partition
  (:mod:`streams.core.allowance`). The outcome names the
  account's inbox topic, which the worker creates before it sends the batch's outputs — no
  other event names a topic to create.
* ``rotate_keys`` must carry the next version, be signed by the current key *and* by the new one.
  A stolen old key cannot take an account back, and an old rotation cannot be replayed. Every
  other event is signed at its account's key version (:mod:`streams.wire.signing`), so what an
  old key signed is never applied again, even after a rotation back to that key; the newest
  :data:`~streams.wire.events.MAX_RETIRED_KEYS` past keys are kept to tell the sender so
  (``key_rotated``, :mod:`.auth`).

Account events are keyed by account id, so the worker owning that partition decides alone; every
other worker learns the result from the accounts table's changelog (:class:`Directory`).
"""

from __future__ import annotations

from market.envelope import EnvelopeError, validate_public_key

from ..wire.events import MAX_RETIRED_KEYS, AccountState, OpenAccount, RetiredKey, RotateKeys
from ..wire.invitations import InvitationError, check_invitation
from ..wire.signing import key_id_of, signed_v1, valid_signing_key, verify
from ..wire.work import work_bits
from .auth import old_signature_format
from .context import Context
from .outputs import Defer, Outcome, Output, Reject, dump
from .placement import Misplaced, check_partition, refuse_misplaced
from .rejections import Source

__all__ = ["handle_account"]


def handle_account(
    ctx: Context, ev: OpenAccount | RotateKeys, src: Source, *, final: bool = True
) -> Outcome:
    """Apply one ``open_account`` or ``rotate_keys`` event (parsed by the router; proved and
    placed here, by the rules of accounts: an opening proves possession of the key it pins).

    With ``final`` False, a rotation on a foreign partition whose signature this worker cannot
    prove yet (its replica of the accounts may lag) is *deferred*, as every other event naming
    an account the directory has not read is: refused unproven, no record of it would remain,
    and a copy on its own partition would later be applied.
    """
    try:
        check_partition(ctx, src, ev.account_id)
    except Misplaced as where:  # forwarded only if its signature proves who sent it
        proven = _self_signed(ctx, ev) if isinstance(ev, OpenAccount) else _signed_by_owner(ctx, ev)
        if proven:
            raise
        if not final and isinstance(ev, RotateKeys):
            raise Defer(ev.account_id) from None
        rej = refuse_misplaced(ctx, src, where)
        rej.claimed = ev.account_id
        raise rej from None
    if isinstance(ev, OpenAccount):
        return _open(ctx, ev)
    return _rotate(ctx, ev)


def _signed_by_owner(ctx: Context, ev: OpenAccount | RotateKeys) -> str | None:
    """``ev.account_id`` if the account exists and its current key signed ``ev``, else None."""
    acct = ctx.directory.get(ev.account_id)
    if acct is None or ev.key_id != acct.key_id:
        return None
    return ev.account_id if verify(ctx.market, ev, acct.signing_key) else None


def _self_signed(ctx: Context, ev: OpenAccount) -> bool:
    """Whether ``ev`` is signed with the key it pins (its proof of possession)."""
    return ev.key_id == key_id_of(ev.signing_key) and verify(ctx.market, ev, ev.signing_key)


def _open(ctx: Context, ev: OpenAccount) -> Outcome:
    _check_signing_key(ev.signing_key, claimed=ev.account_id)
    if not _self_signed(ctx, ev):
        if signed_v1(ctx.market, ev, ev.signing_key):
            raise old_signature_format(ev.account_id, claimed=ev.account_id)
        raise Reject(
            "bad_signature",
            f"open_account for {ev.account_id!r} must be signed with the key it pins "
            f"({key_id_of(ev.signing_key)}); the signature does not match",
            claimed=ev.account_id,
        )
    existing = ctx.stores.accounts.get(ev.account_id)
    if existing is not None:
        if existing.signing_key != ev.signing_key or existing.version != 1:
            raise Reject(
                "account_exists",
                f"account {ev.account_id!r} is already open with another key; choose another "
                "account id (keys change only by rotate_keys, signed with the current key)",
                claimed=ev.account_id,
            )
        return _confirm(ctx, existing, "duplicate")
    if ctx.limits.openings == "invite":
        try:
            check_invitation(
                ev.invitation,
                ctx.topics.prefix,
                ctx.keys.public_key,
                ev.account_id,
                ev.signing_key,
                ctx.clock(),
            )
        except InvitationError as exc:
            raise Reject(exc.reason, str(exc), claimed=ev.account_id) from None
    elif ctx.limits.opening_work:
        _check_work(ctx, ev)
    _check_sealing_key(ctx, ev.sealing_key, claimed=ev.account_id)
    if len(ctx.directory) >= ctx.limits.max_accounts:
        raise Reject(
            "too_many_accounts",
            f"the market holds its maximum of {ctx.limits.max_accounts} accounts; ask the "
            "operators (EMARKET_MAX_ACCOUNTS)",
            claimed=ev.account_id,
        )
    ctx.allowance.open_account(ctx.topics.partition_of(ev.account_id), ev.account_id)
    state = AccountState(
        account_id=ev.account_id,
        version=1,
        signing_key=ev.signing_key,
        sealing_key=ev.sealing_key,
        key_id=ev.key_id,
        opened_at_ms=ev.opened_at_ms,
        updated_at_ms=ev.opened_at_ms,
    )
    return _store(ctx, state, "accepted")


def _check_work(ctx: Context, ev: OpenAccount) -> None:
    """Refuse an opening of an open market that carries less work than the market asks
    (:mod:`streams.wire.work`): what bounds one sender's openings by its computing power."""
    need = ctx.limits.opening_work
    got = (
        0
        if ev.work is None
        else work_bits(ctx.topics.prefix, ev.account_id, ev.signing_key, ev.work)
    )
    if got < need:
        raise Reject(
            "more_work",
            f"this market opens an account for {need} bits of proof of work "
            f"(EMARKET_OPENING_WORK; docs/protocol.md §6.1.2) and the opening carries {got}: "
            "the client library and `epsilon-market account open` do the work",
            claimed=ev.account_id,
            bits=need,
        )


def _rotate(ctx: Context, ev: RotateKeys) -> Outcome:
    market = ctx.market
    acct = ctx.stores.accounts.get(ev.account_id)
    if acct is None:
        raise Reject(
            "unknown_account", f"account {ev.account_id!r} is not open", claimed=ev.account_id
        )
    if ev.key_id != acct.key_id or not verify(market, ev, acct.signing_key):
        if ev.key_id == acct.key_id and signed_v1(market, ev, acct.signing_key):
            raise old_signature_format(ev.account_id, sender=ev.account_id)
        raise Reject(
            "bad_signature",
            f"rotate_keys for {ev.account_id!r} must be signed with its current key "
            f"({acct.key_id}); the signature does not match",
            claimed=ev.account_id,
        )
    _check_signing_key(ev.signing_key, sender=ev.account_id)
    if not verify(market, ev, ev.signing_key, ev.new_key_signature):
        raise Reject(
            "bad_signature",
            "new_key_signature must sign the same fields with the new key (proof of possession)",
            sender=ev.account_id,
        )
    if ev.version != acct.version + 1:
        if ev.version <= acct.version and ev.signing_key == acct.signing_key:
            return _confirm(ctx, acct, "duplicate")
        raise Reject(
            "stale_key_version",
            f"account {ev.account_id!r} is at key version {acct.version}; a rotation must carry "
            f"version {acct.version + 1}",
            sender=ev.account_id,
        )
    _check_sealing_key(ctx, ev.sealing_key, sender=ev.account_id)
    retired = [*acct.retired, RetiredKey(version=acct.version, signing_key=acct.signing_key)]
    state = acct.model_copy(
        update={
            "version": ev.version,
            "signing_key": ev.signing_key,
            "sealing_key": ev.sealing_key,
            "key_id": key_id_of(ev.signing_key),
            "updated_at_ms": ev.rotated_at_ms,
            "retired": retired[-MAX_RETIRED_KEYS:],
        }
    )
    return _store(ctx, state, "accepted")


def _check_signing_key(key: str, **who: str) -> None:
    """Refuse a signing key nobody holds the secret of (the identity, another small-order or
    mixed-order point, a non-canonical encoding): strict verification refuses every signature
    under it, and a lax one would accept signatures by nobody (docs/protocol.md §5)."""
    if not valid_signing_key(key):
        raise Reject(
            "invalid_key",
            "the signing key is not an Ed25519 public key anyone holds the secret of (a point "
            "of small or mixed order, or a non-canonical encoding); generate a new one "
            "(epsilon-market keygen)",
            **who,
        )


def _check_sealing_key(ctx: Context, key: str | None, **who: str) -> None:
    """Refuse a sealing key nothing can be sealed for (a low-order X25519 point): accepted, it
    would make every delivery to the account fail; and none in a market with v2 inboxes, whose
    records are routed and sealed with it (docs/protocol.md §8.5.2)."""
    if key is None:
        if ctx.topics.inboxes == 2:
            raise Reject(
                "encryption_required",
                "this market's inboxes (v2) are routed and sealed with the account's sealing "
                "key: give one (epsilon-market keygen makes key files with one)",
                **who,
            )
        return
    try:
        validate_public_key(key)
    except EnvelopeError as exc:
        raise Reject(
            "invalid_key",
            f"the sealing key cannot be used: {exc}; generate a new one (epsilon-market keygen)",
            **who,
        ) from exc


def _store(ctx: Context, state: AccountState, status: str) -> Outcome:
    replaced = ctx.stores.accounts.get(state.account_id)
    ctx.stores.accounts[state.account_id] = state
    ctx.directory.learn(state, replaced)
    return _confirm(ctx, state, "accepted")


def _confirm(ctx: Context, state: AccountState, status: str) -> Outcome:
    """The account's state to its inbox, and the inbox to create (idempotent: a resend after a
    crash between storing the account and making the topic has it made then)."""
    inbox = ctx.topics.inbox(state.account_id)
    return Outcome(
        "account",
        "accepted" if status == "accepted" else "duplicate",
        [Output(inbox, state.account_id.encode(), dump(state))],
        create_topics=[] if ctx.topics.inboxes == 2 else [ctx.topics.inbox_spec(state.account_id)],
    )
