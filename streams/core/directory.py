"""The directory of accounts: whose key signs for whom, on every worker.

Account events are processed by the worker that owns the account's partition; every other
worker needs the result to verify signatures on any stream. The worker feeds a replica from the
accounts table's changelog (:mod:`streams.worker.directory`); the core looks accounts up here,
its own writes first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..wire.events import AccountState

__all__ = ["Directory", "DirectoryReplica"]


class DirectoryReplica(Protocol):
    """Every account of the market, as read from the accounts changelog (worker side)."""

    def get(self, account_id: str) -> AccountState | None: ...

    def owner_of_key(self, key_id: str) -> str | None: ...

    def __len__(self) -> int: ...


class Directory:
    """Accounts by id and by key: this worker's own writes first, then the replica.

    In the core's tests every account is local (the replica is ``None``); in the worker the
    replica holds every account of every partition.
    """

    def __init__(
        self, local: Mapping[str, AccountState], replica: DirectoryReplica | None = None
    ) -> None:
        self.local = local
        self.replica = replica
        self._keys: dict[str, str] = {}

    def get(self, account_id: str) -> AccountState | None:
        found = self.local.get(account_id)
        if found is None and self.replica is not None:
            found = self.replica.get(account_id)
        return found

    def owner_of_key(self, key_id: str) -> str | None:
        owner = self._keys.get(key_id)
        if owner is None and self.replica is not None:
            owner = self.replica.owner_of_key(key_id)
        return owner

    def learn(self, state: AccountState, replaced: AccountState | None = None) -> None:
        """Index an account this worker just wrote (the replica sees it a little later), and
        forget the key it ``replaced`` (each rotation left one entry behind, for ever)."""
        if replaced is not None and self._keys.get(replaced.key_id) == replaced.account_id:
            del self._keys[replaced.key_id]
        self._keys[state.key_id] = state.account_id

    def __len__(self) -> int:
        return max(len(self.local), len(self.replica) if self.replica is not None else 0)
