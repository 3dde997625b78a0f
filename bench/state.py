"""What sealing the market's state costs per record (#39), against the format it replaced.

Run ``python -m bench.state`` (``--quick`` for a smoke run). No broker: the calls a worker
makes for each changelog record, on records of the sizes the core writes, timed in CPU time of
this thread (:func:`time.thread_time`) over many calls. In the same run, the **baseline** is
what state format 1 did for a record: one HMAC-SHA256 over the store, the key and the value
(the tag in its header; its formula, docs/protocol.md §3 of format 1, is written out here). For
format 2 (docs/protocol.md §3):

* **seal** — a random 24-byte nonce, XChaCha20-Poly1305 over the record under the stamp and
  the AAD (:meth:`StateSeal.seal`), what a batch pays per record it writes;
* **open** — the reverse (:meth:`StateSeal.open`), what recovery, the account replica and a
  RocksDB read pay per record;
* **digests** — the two keyed digests a write moves in its partition's sums (the key's old
  version out, its new one in: :func:`~streams.worker.state_records.entry_digest`);
* **bytes** — what a record carries on top of its plaintext: format 1's 33-byte header; format
  2's 26-byte stamp and the seal's 40 bytes (nonce and tag).

Per batch and partition it touches, format 2 also writes one checkpoint (shown last). Ratios are
seal (+ digests) over the baseline tag, per run; min / median / max over ``--runs``.
"""

from __future__ import annotations

import argparse
import hmac
import os
import statistics
import time
from collections.abc import Callable

from bench.machine import Machine
from streams.worker.checkpoints import Checkpoint, StoreSum
from streams.worker.history import PROGRESS
from streams.worker.state_records import HEADER, Stamp, StateSeal, Version

__all__ = ["SIZES", "main", "measure"]

SIZES: dict[str, tuple[str, int]] = {
    "mark": ("releases", 52),
    "purchase": ("purchases", 180),
    "account": ("accounts", 420),
    "stream": ("streams", 1_100),
    "chain state": ("releases", 3_300),
}
"""Record kind → (store, plaintext bytes): an eviction mark, a purchase's decision, an account,
a stream's record, a value's chain state of 8 numbers at 16 steps (as ``bench.service``'s)."""

_V1 = b"emarket-state-v1"


def v1_tag(key: bytes, store: str, rkey: bytes, value: bytes) -> bytes:
    """Format 1's header: ``u8(1) ‖ HMAC-SHA256(k, domain ‖ store ‖ key ‖ value)``."""
    name = store.encode()
    covered = b"".join(
        (
            _V1,
            bytes([len(name)]),
            name,
            len(rkey).to_bytes(4, "big"),
            rkey,
            b"\x01",
            len(value).to_bytes(4, "big"),
            value,
        )
    )
    return b"\x01" + hmac.digest(key, covered, "sha256")


def _cpu_us(fn: Callable[[], object], n: int) -> float:
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n * 1e6


def measure(store: str, size: int, n: int) -> dict[str, float]:
    """µs per record of each operation, for one record of ``size`` bytes of ``store``."""
    seal = StateSeal(os.urandom(32), os.urandom(32))
    mac_key, key, value = os.urandom(32), b"stream-0001/value-000042", os.urandom(size)
    stamp = Stamp(2, Version((7 << 32) | 99, 12_345), 2, 987_654)
    head, sealed = seal.seal(store, key, value, stamp)
    version = Version(stamp.version.epoch, stamp.version.n)
    ktext = key.decode()
    return {
        "tag": _cpu_us(lambda: v1_tag(mac_key, store, key, value), n),
        "seal": _cpu_us(lambda: seal.seal(store, key, value, stamp), n),
        "open": _cpu_us(lambda: seal.open(store, key, sealed, head), n),
        "digests": 2 * _cpu_us(lambda: seal.digest(store, ktext, version), n),
        "v1_bytes": float(len(v1_tag(mac_key, store, key, value))),
        "v2_bytes": float(len(head[0][1]) + len(sealed or b"") - size),
    }


def checkpoint_cost(n: int) -> tuple[float, int]:
    """µs and bytes of one checkpoint record (six stores' sums, four positions, a few epochs)."""
    seal = StateSeal(os.urandom(32), os.urandom(32))
    cp = Checkpoint(
        3,
        Version((7 << 32) | 99, 12_345),
        1_780_000_000_000,
        {f"p.{t}": 10**6 for t in ("accounts", "registrations", "values", "purchases")},
        {
            s: StoreSum(10**4, int.from_bytes(os.urandom(32), "big"), 10**6)
            for s in ("registered", "streams", "releases", "purchases", "accounts", "holders")
        },
        {(e << 32) | 5: 10**5 for e in range(1, 4)},
    )

    def one() -> object:
        return seal.seal(PROGRESS, b"3", cp.to_bytes(), Stamp(3, cp.version))

    head, sealed = seal.seal(PROGRESS, b"3", cp.to_bytes(), Stamp(3, cp.version))
    return _cpu_us(one, n), len(head[0][1]) + len(sealed or b"")


def _row(name: str, runs: list[dict[str, float]]) -> str:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    ratios = sorted((r["seal"] + r["digests"]) / r["tag"] for r in runs)
    return (
        f"| {name} | {SIZES[name][1]:,} | {med['tag']:.2f} | {med['seal']:.2f} | "
        f"{med['open']:.2f} | {med['digests']:.2f} | "
        f"{ratios[0]:.1f}x / {statistics.median(ratios):.1f}x / {ratios[-1]:.1f}x | "
        f"{med['v1_bytes']:.0f} | {med['v2_bytes']:.0f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (few calls)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    n, runs = (200, 1) if args.quick else (20_000, args.runs)
    machine = Machine.now()
    print(
        "State records: CPU µs per record, format 2 against format 1 measured in the same "
        f"run ({n:,} calls per figure, median of {runs} runs)\n"
    )
    print(
        "| record | plaintext B | v1 tag | v2 seal | v2 open | v2 digests | "
        "(seal + digests) ÷ tag, min / med / max | v1 extra B | v2 extra B |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (store, size) in SIZES.items():
        print(_row(name, [measure(store, size, n) for _ in range(runs)]))
    us, size = checkpoint_cost(n)
    print(
        f"\nOne checkpoint per partition a batch touches: {us:.2f} µs to seal, {size:,} B "
        f"(header {HEADER!r} included)\n"
    )
    print(machine.line())


if __name__ == "__main__":
    main()
