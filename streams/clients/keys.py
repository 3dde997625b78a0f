"""A party's identity: its account id, Ed25519 signing key and X25519 sealing key.

Sellers and buyers each hold one :class:`Party`. The signing key signs every event they send
(the market pins its public half when the account is opened); the sealing key opens the
releases the market seals for them. ``epsilon-market keygen`` writes one to a key file (JSON,
mode 0600); :meth:`Party.load` reads it back and never creates one by accident.

Making and reading keys needs only ``cryptography``: the event models and their signing
(pydantic, numpy) are imported when a party first signs, so ``keygen`` starts at once.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
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

__all__ = ["KeyFileError", "Party"]

M = TypeVar("M", bound="BaseModel")
KEY_FILE_VERSION = 1


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or not a party's keys."""


def _raw(key: Ed25519PrivateKey | X25519PrivateKey) -> str:
    data = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class Party:
    """A seller or buyer: an account id and its keys (``repr`` shows no secret)."""

    account_id: str
    signing_key: Ed25519PrivateKey
    sealing_key: X25519PrivateKey | None = None
    key_version: int = 1
    """The account's key version these keys are pinned at (1 until the first rotation): every
    event is signed at it, so nothing signed at an earlier version is ever applied again."""

    @classmethod
    def generate(cls, account_id: str, *, sealing: bool = True) -> Party:
        """New keys for ``account_id`` (buyers need the sealing key; sellers may skip it)."""
        import re  # noqa: PLC0415

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

    # -- key files ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the keys to a new file readable by its owner only (never overwrites)."""
        sealing = None if self.sealing_key is None else _raw(self.sealing_key)
        body = {
            "version": KEY_FILE_VERSION,
            "account_id": self.account_id,
            "signing_key": _raw(self.signing_key),
            "sealing_key": sealing,
            **({"key_version": self.key_version} if self.key_version > 1 else {}),
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(body, indent=2) + "\n")

    def save_over(self, path: str | Path) -> None:
        """Replace the key file at ``path`` with these keys, atomically (the key version changed
        after a rotation)."""
        tmp = Path(f"{path}.tmp")
        tmp.unlink(missing_ok=True)
        self.save(tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> Party:
        """Read a key file written by :meth:`save` (``epsilon-market keygen``)."""
        p = Path(path)
        try:
            body = json.loads(p.read_text())
            if body.get("version") != KEY_FILE_VERSION:
                raise KeyError("version")
            signing = Ed25519PrivateKey.from_private_bytes(base64.b64decode(body["signing_key"]))
            raw = body.get("sealing_key")
            sealing = (
                None if raw is None else X25519PrivateKey.from_private_bytes(base64.b64decode(raw))
            )
            version = body.get("key_version", 1)
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise KeyError("key_version")
            return cls(str(body["account_id"]), signing, sealing, version)
        except FileNotFoundError:
            raise KeyFileError(
                f"no key file at {p}; create one with `epsilon-market keygen --account ID "
                f"--out {p}`"
            ) from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise KeyFileError(
                f"{p} is not an epsilon-market key file (written by `epsilon-market keygen`)"
            ) from None
