"""A party's identity: its account id, Ed25519 signing key and X25519 sealing key.

Sellers and buyers each hold one :class:`Party`. The signing key signs every event they send
(the market pins its public half when the account is opened); the sealing key opens the
releases the market seals for them, and the sealing keys it rotated away from (``previous``)
still open what was sealed to them before. ``epsilon-market keygen`` writes one to a key file
(docs/protocol.md §5.2, the format the Node client shares; mode 0600); :meth:`Party.load` reads
it back and never creates one by accident.

Making and reading keys needs only ``cryptography``: the event models and their signing
(pydantic, numpy) are imported when a party first signs, so ``keygen`` starts at once.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from market.envelope import public_key_b64 as x25519_public_b64

from ..wire.ids import ID_PATTERN, public_b64

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..wire.events import Invitation, OpenAccount, RotateKeys
    from ..wire.signing import MarketRef

__all__ = ["KeyFileError", "Party", "SealingKey", "exposure"]

M = TypeVar("M", bound="BaseModel")
KEY_FILE_VERSION = 2
"""Written by this client; version 1 (the private keys under ``signing_key`` and
``sealing_key``) and the Node client's first files (no ``version``, hex) are still read."""
_B64_32 = re.compile(r"^[A-Za-z0-9+/]{43}=$")
_HEX_32 = re.compile(r"^[0-9a-f]{64}$")


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or not a party's keys."""


def _raw(key: Ed25519PrivateKey | X25519PrivateKey) -> str:
    data = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class SealingKey:
    """An X25519 sealing key and the account's key version it was pinned at: what the market
    sealed to while the account was at that version opens with it."""

    version: int
    key: X25519PrivateKey

    @property
    def public_key(self) -> str:
        return x25519_public_b64(self.key)

    def __repr__(self) -> str:
        return f"SealingKey(version={self.version}, key={self.public_key[:8]}…)"


@dataclass(frozen=True)
class Party:
    """A seller or buyer: an account id and its keys (``repr`` shows no secret)."""

    account_id: str
    signing_key: Ed25519PrivateKey
    sealing_key: X25519PrivateKey | None = None
    key_version: int = 1
    """The account's key version these keys are pinned at (1 until the first rotation): every
    event is signed at it, so nothing signed at an earlier version is ever applied again."""
    previous: tuple[SealingKey, ...] = ()
    """The sealing keys of earlier key versions, oldest first: releases sealed before a rotation
    stay readable (``account rotate`` records the retired key here). Retired signing keys are
    not kept: nothing they sign is ever applied again (docs/protocol.md §2.3)."""

    @classmethod
    def generate(cls, account_id: str, *, sealing: bool = True) -> Party:
        """New keys for ``account_id`` (buyers need the sealing key; sellers may skip it)."""
        if not re.fullmatch(ID_PATTERN, account_id):
            raise KeyFileError(
                f"account id {account_id!r} must be 1-64 of letters, digits, '_' and '-'"
            )
        return cls(
            account_id,
            Ed25519PrivateKey.generate(),
            X25519PrivateKey.generate() if sealing else None,
        )

    @property
    def public_key(self) -> str:
        """The signing key's public half (base64), as pinned by the market."""
        return public_b64(self.signing_key)

    @property
    def sealing_public_key(self) -> str | None:
        return None if self.sealing_key is None else x25519_public_b64(self.sealing_key)

    @property
    def sealing_keys(self) -> tuple[SealingKey, ...]:
        """Every sealing key this party holds, the current one first, then the newest retired."""
        now = () if self.sealing_key is None else (SealingKey(self.key_version, self.sealing_key),)
        return now + tuple(reversed(self.previous))

    def retiring(self, version: int) -> tuple[SealingKey, ...]:
        """``previous`` once these keys, pinned at ``version``, are rotated away from: the
        sealing key joins the retired ones (what the new key file records)."""
        by_version = {k.version: k for k in self.previous}
        if self.sealing_key is not None:
            by_version[version] = SealingKey(version, self.sealing_key)
        # one key per version, and per public key (the newest version's)
        by_key = {by_version[v].public_key: by_version[v] for v in sorted(by_version)}
        return tuple(sorted(by_key.values(), key=lambda k: k.version))

    def holding(self, others: Iterable[Party]) -> Party:
        """This party, also holding every sealing key of ``others`` (older key files of the
        same account) as retired keys, to read what was sealed to them (a reader's set of keys:
        two files may name one version, so it is not written back as a key file)."""
        got = list(self.previous)
        for o in others:
            if o.account_id != self.account_id:
                raise KeyFileError(
                    f"a key file of account {o.account_id!r} cannot open {self.account_id!r}'s "
                    "releases"
                )
            got.extend(o.sealing_keys)
        unique = {k.public_key: k for k in got if k.public_key != self.sealing_public_key}
        return replace(self, previous=tuple(sorted(unique.values(), key=lambda k: k.version)))

    def __repr__(self) -> str:
        return f"Party({self.account_id!r}, key={self.public_key[:8]}…)"

    # -- events ---------------------------------------------------------------------------------
    def sign(self, model: type[M], market: MarketRef, **fields: Any) -> M:
        """A signed event of type ``model`` for ``market`` (its prefix and key id)."""
        from ..wire.signing import signed  # noqa: PLC0415 - pydantic and numpy, when first used

        return signed(model, market, self.signing_key, generation=self.key_version, **fields)

    def open_account(
        self,
        market: MarketRef,
        *,
        opened_at_ms: int | None = None,
        invitation: Invitation | None = None,
        work: str | None = None,
    ) -> OpenAccount:
        """The opening of this party's account, with the operators' ``invitation`` if the
        market opens accounts by invitation, or the proof of ``work`` an open market asks
        (neither is under the party's signature)."""
        from ..wire.events import OpenAccount  # noqa: PLC0415

        return self.sign(
            OpenAccount,
            market,
            account_id=self.account_id,
            signing_key=self.public_key,
            sealing_key=self.sealing_public_key,
            opened_at_ms=opened_at_ms or time.time_ns() // 1_000_000,
            invitation=invitation,
            work=work,
        )

    def rotate_to(
        self, new: Party, market: MarketRef, version: int, *, rotated_at_ms: int | None = None
    ) -> RotateKeys:
        """The event replacing this party's keys by ``new``'s (signed by both)."""
        from ..wire.events import RotateKeys  # noqa: PLC0415
        from ..wire.signing import sign  # noqa: PLC0415

        fields = dict(
            account_id=self.account_id,
            version=version,
            signing_key=new.public_key,
            sealing_key=new.sealing_public_key,
            rotated_at_ms=rotated_at_ms or time.time_ns() // 1_000_000,
        )
        draft = self.sign(RotateKeys, market, **fields, new_key_signature="A" * 86 + "==")
        return draft.model_copy(update={"new_key_signature": sign(market, draft, new.signing_key)})

    # -- key files (docs/protocol.md §5.2) ------------------------------------------------------
    def key_file(self) -> str:
        """The key file's text: JSON, two-space indented, members in the order of §5.2."""
        sealing = None if self.sealing_key is None else _raw(self.sealing_key)
        body = {
            "version": KEY_FILE_VERSION,
            "account_id": self.account_id,
            "key_version": self.key_version,
            "signing_private_key": _raw(self.signing_key),
            "signing_key": self.public_key,
            "sealing_private_key": sealing,
            "sealing_key": self.sealing_public_key,
            "previous": [
                {
                    "key_version": k.version,
                    "sealing_private_key": _raw(k.key),
                    "sealing_key": k.public_key,
                }
                for k in self.previous
            ],
        }
        return json.dumps(body, indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the keys to a new file readable by its owner only (never overwrites)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.key_file())

    def save_over(self, path: str | Path) -> None:
        """Replace the key file at ``path`` with these keys, atomically (the key version changed
        after a rotation); the new file is readable by its owner only, whatever the old was."""
        tmp = Path(f"{path}.tmp")
        tmp.unlink(missing_ok=True)
        self.save(tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path, *, on_warning: Callable[[str], None] | None = None) -> Party:
        """Read a key file (docs/protocol.md §5.2; also the earlier formats).

        A file that others may read or change is read, and ``on_warning`` (default: a
        :class:`UserWarning`) is told so with the ``chmod`` that fixes it (:func:`exposure`).
        """
        p = Path(path)
        try:
            text = p.read_text("utf-8")
        except FileNotFoundError:
            raise KeyFileError(
                f"no key file at {p}; create one with `epsilon-market keygen --account ID "
                f"--out {p}`"
            ) from None
        except IsADirectoryError:
            raise KeyFileError(f"{p} is a directory, not a key file") from None
        except PermissionError:
            raise KeyFileError(f"cannot read the key file {p}: permission denied") from None
        except (OSError, UnicodeDecodeError):
            raise KeyFileError(f"{p} is not an epsilon-market key file") from None
        said = exposure(p)
        if said is not None:
            if on_warning is None:
                import warnings  # noqa: PLC0415

                warnings.warn(said, UserWarning, stacklevel=2)
            else:
                on_warning(said)
        try:
            return _parse(json.loads(text))
        except _Bad as exc:
            raise KeyFileError(
                f"{p} is not an epsilon-market key file ({exc}; docs/protocol.md §5.2)"
            ) from None
        except ValueError:
            raise KeyFileError(
                f"{p} is not an epsilon-market key file (not JSON; docs/protocol.md §5.2)"
            ) from None


def exposure(path: str | Path) -> str | None:
    """The warning for a key file that users other than its owner may read or change (any
    group or other permission bit), naming the fix; None if it is private (or the system has
    no such bits).

    Such a file is read, not refused: the keys may already be copied, and a person who is told
    how to fix it can do so and rotate the keys (``account rotate``), whereas a refusal would
    also lock out the file systems that cannot store modes (some mounts show every file 0777).
    """
    if os.name != "posix":
        return None
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (
        f"warning: the key file {path} can be read or changed by other users (mode "
        f"{mode:04o}): its private keys may be exposed; make it yours alone with "
        f"`chmod 600 {path}` (and rotate the keys if others may have read it)"
    )


class _Bad(ValueError):
    """What is wrong in a key file's JSON (said after the file's name)."""


def _private(body: dict[str, Any], name: str, *, hexed: bool = False) -> bytes | None:
    raw = body.get(name)
    if raw is None:
        return None
    pattern = _HEX_32 if hexed else _B64_32
    if not isinstance(raw, str) or not pattern.fullmatch(raw):
        what = "64 lower-case hex digits" if hexed else "base64 of 32 bytes (44 characters)"
        raise _Bad(f"`{name}` must be {what}")
    return bytes.fromhex(raw) if hexed else base64.b64decode(raw, validate=True)


def _version(body: dict[str, Any], name: str = "key_version") -> int:
    v = body.get(name, 1)
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v < 2**31:
        raise _Bad(f"`{name}` must be an integer from 1")
    return v


def _checked(body: dict[str, Any], name: str, derived: str | None) -> None:
    """A public key a file states must be the one its private key gives (two files mixed up)."""
    said = body.get(name)
    if said is not None and said != derived:
        raise _Bad(f"`{name}` is not the public key of its private key")


def _parse(body: Any) -> Party:
    """A :class:`Party` from a key file's JSON, in any format this client reads."""
    if not isinstance(body, dict):
        raise _Bad("not a JSON object")
    fmt = body.get("version")
    if fmt == KEY_FILE_VERSION:
        names, hexed = ("signing_private_key", "sealing_private_key"), False
    elif fmt == 1:  # this client's first format: private keys under the public keys' names
        names, hexed = ("signing_key", "sealing_key"), False
    elif fmt is None and "signing_private_key" in body:  # the Node client's first format
        names, hexed = ("signing_private_key", "sealing_private_key"), True
    else:
        raise _Bad(f"format version {fmt!r}; this client reads 1 and 2")
    account = body.get("account_id")
    if not isinstance(account, str) or not re.fullmatch(ID_PATTERN, account):
        raise _Bad("`account_id` must be 1-64 of letters, digits, '_' and '-'")
    seed = _private(body, names[0], hexed=hexed)
    if seed is None:
        raise _Bad(f"no `{names[0]}`")
    box = _private(body, names[1], hexed=hexed)
    party = Party(
        account,
        Ed25519PrivateKey.from_private_bytes(seed),
        None if box is None else X25519PrivateKey.from_private_bytes(box),
        _version(body),
    )
    if fmt != 1:
        _checked(body, "signing_key", party.public_key)
        _checked(body, "sealing_key", party.sealing_public_key)
    return replace(party, previous=_previous(body.get("previous", []), party.key_version))


def _previous(items: Any, current: int) -> tuple[SealingKey, ...]:
    if not isinstance(items, list):
        raise _Bad("`previous` must be a list")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise _Bad("each of `previous` must be an object")
        version, raw = _version(item), _private(item, "sealing_private_key")
        if raw is None:
            raise _Bad("an entry of `previous` has no `sealing_private_key`")
        key = SealingKey(version, X25519PrivateKey.from_private_bytes(raw))
        _checked(item, "sealing_key", key.public_key)
        out.append(key)
    versions = [k.version for k in out]
    if versions != sorted(set(versions)) or (versions and versions[-1] >= current):
        raise _Bad("`previous` must list distinct versions below `key_version`, oldest first")
    return tuple(out)
