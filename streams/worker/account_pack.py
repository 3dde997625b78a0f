"""One account of the replica as one small bytes object, decoded only when an event asks.

Every worker keeps every account (:mod:`streams.worker.directory`). Held as a pydantic
:class:`~streams.wire.events.AccountState` (base64 and hex text, a dict, a list, a set of fields)
an account took ~1,460–1,820 B of heap, 146 MB per worker at the 100,000-account bound. Packed,
it is its raw fields in one ``bytes`` (~150 B with a sealing key): the version of the market's
history that wrote it and its partition, then the state's integers, its raw 32-byte keys and
8-byte key id. An event that names the account pays for one :func:`unpack` (~6–8 µs here,
more on a busy machine, against a purchase's ~1 ms; the replica keeps the last accounts asked
for decoded); the replica's rules (versions, checkpoints, digests) read only the header.

Packing keeps everything :meth:`AccountState.model_validate_json` would give back: the same
field values *and* the same set of fields given (so the same JSON with ``exclude_unset``). A
state whose text a packed form could not give back byte for byte (a base64 key written with
non-zero padding bits, an integer beyond 64 bits) is not packed: :func:`pack` answers None and
the replica keeps that object as it is.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any

from ..wire.events import AccountState, RetiredKey
from ..wire.trusted import trusted
from .state_records import Version

__all__ = ["HEAD_BYTES", "head", "key_index", "key_of", "pack", "raw_head", "unpack"]

_HEAD = struct.Struct(">QQI")  # held version (epoch, n), partition
_BODY = struct.Struct(">BQQQ32s8s")  # flags, version, opened_at_ms, updated_at_ms, key, key id
_KEY = struct.Struct(">32s")
_RETIRED = struct.Struct(">Q32s")  # a retired key: the version it signed at, the key
HEAD_BYTES = _HEAD.size
_KEY_ID_AT = HEAD_BYTES + _BODY.size - 8

_SEALING = 1  # a sealing key follows the body
_SEALING_GIVEN = 2  # "sealing_key" was given (possibly as null)
_RETIRED_GIVEN = 4  # "retired" was given: a count and the retired keys follow
_SCHEMA_GIVEN = 8
_TYPE_GIVEN = 16
_MAX_INT = (1 << 64) - 1
_KEY_ID = re.compile(r"[0-9a-f]{16}")


def _raw_key(b64: str) -> bytes | None:
    """The 32 raw bytes of ``b64``, if encoding them gives ``b64`` back exactly."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 and base64.b64encode(raw).decode() == b64 else None


def _fits(*ints: int) -> bool:
    return all(0 <= i <= _MAX_INT for i in ints)


def key_index(key_id: str) -> int | None:
    """The integer a key id is indexed under (36 B instead of a 65-B text), None for a text
    that is not a key id (it then names no account)."""
    return int(key_id, 16) if _KEY_ID.fullmatch(key_id) else None


def _flags(state: AccountState) -> int:
    given = state.model_fields_set
    flags = _SEALING if state.sealing_key is not None else 0
    for name, bit in (
        ("sealing_key", _SEALING_GIVEN),
        ("retired", _RETIRED_GIVEN),
        ("schema_version", _SCHEMA_GIVEN),
        ("type", _TYPE_GIVEN),
    ):
        if name in given:
            flags |= bit
    return flags


def _tail(state: AccountState, flags: int) -> list[bytes] | None:
    """The sealing key and retired keys, packed; None if one cannot be given back exactly."""
    parts: list[bytes] = []
    if state.sealing_key is not None:
        sealing = _raw_key(state.sealing_key)
        if sealing is None:
            return None
        parts.append(sealing)
    if flags & _RETIRED_GIVEN:
        parts.append(bytes([len(state.retired)]))
        for old in state.retired:
            raw = _raw_key(old.signing_key)
            if raw is None or not _fits(old.version):
                return None
            parts.append(_RETIRED.pack(old.version, raw))
    return parts


def pack(version: Version, partition: int, state: AccountState) -> bytes | None:
    """``state`` as held by the replica (written at ``version`` on ``partition``), packed; None
    if its fields cannot all be given back exactly (the module docstring)."""
    signing = _raw_key(state.signing_key)
    key_id = key_index(state.key_id)
    if (
        signing is None
        or key_id is None
        or not _fits(version.epoch, version.n, state.version)
        or not _fits(state.opened_at_ms, state.updated_at_ms)
        or not 0 <= partition <= 0xFFFFFFFF
        or state.schema_version != 1
    ):
        return None
    flags = _flags(state)
    tail = _tail(state, flags)
    if tail is None:
        return None
    body = _BODY.pack(
        flags,
        state.version,
        state.opened_at_ms,
        state.updated_at_ms,
        signing,
        key_id.to_bytes(8, "big"),
    )
    return b"".join([_HEAD.pack(version.epoch, version.n, partition), body, *tail])


def raw_head(packed: bytes) -> tuple[int, int, int]:
    """:func:`head` as plain integers ``(epoch, n, partition)``: the cheapest look at it."""
    epoch, n, partition = _HEAD.unpack_from(packed)
    return epoch, n, partition


def head(packed: bytes) -> tuple[Version, int]:
    """The version that wrote a packed account, and its partition, without decoding it."""
    epoch, n, partition = _HEAD.unpack_from(packed)
    return Version(epoch, n), partition


def key_of(packed: bytes) -> int:
    """The :func:`key_index` of a packed account's key id, without decoding it."""
    return int.from_bytes(packed[_KEY_ID_AT : _KEY_ID_AT + 8], "big")


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


def unpack(account_id: str, packed: bytes) -> AccountState:
    """The :class:`AccountState` :func:`pack` was given (``account_id`` is not packed: the
    replica holds it as the account's key)."""
    flags, version, opened, updated, signing, key_id = _BODY.unpack_from(packed, HEAD_BYTES)
    at = HEAD_BYTES + _BODY.size
    fields: dict[str, Any] = {
        "account_id": account_id,
        "version": version,
        "signing_key": _b64(signing),
        "key_id": key_id.hex(),
        "opened_at_ms": opened,
        "updated_at_ms": updated,
    }
    if flags & _SCHEMA_GIVEN:
        fields["schema_version"] = 1
    if flags & _TYPE_GIVEN:
        fields["type"] = "account"
    if flags & _SEALING:
        (sealing,) = _KEY.unpack_from(packed, at)
        at += _KEY.size
        fields["sealing_key"] = _b64(sealing)
    elif flags & _SEALING_GIVEN:
        fields["sealing_key"] = None
    if flags & _RETIRED_GIVEN:
        fields["retired"] = [
            trusted(RetiredKey, version=v, signing_key=_b64(k))
            for v, k in _RETIRED.iter_unpack(packed[at + 1 : at + 1 + packed[at] * _RETIRED.size])
        ]
    return trusted(AccountState, **fields)
