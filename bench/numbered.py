"""Numbered value batches (docs/protocol.md §6.4.1): what a stream keeps to recognise a resend,
and what numbering costs the core per value, against unnumbered batches in the same run.

Run ``python -m bench.numbered`` (``--quick`` for a smoke run). No broker: the market core on
plain dict stores, as ``bench.core``.

* **State per stream.** ``n`` values published in batches of 16 into a stream, numbered and
  not; for each, the bytes the stream keeps to recognise a resend: for numbered batches its
  :class:`~streams.core.state.BatchNumbers` in the stream's record, for unnumbered ones the
  values' marks (:class:`~streams.core.state.EvictedValue`, at most ``Caps.marks``), and how
  far back a resend is still recognised. ``n`` stands for the rate: the values published
  within the dedup horizon (7 days) are the rate × 604,800 s. The worst case of a numbered
  stream, a full window of numbers above a gap, is shown last.
* **CPU per value.** ``bench.core``'s value path at 16 values per batch, numbered and not,
  alternated run by run on fresh cores; each as a ratio to the path's crypto floor timed in
  the same run (``bench.core``: the verification, opening, answer and delivery signatures),
  and numbered ÷ unnumbered per run.
"""

from __future__ import annotations

import argparse
import statistics

from bench.core import Measure, measure, prepare_values
from bench.machine import Machine
from bench.service import BATCH
from streams.core.codecs import encode_value
from streams.core.replay.records import Caps
from streams.core.state import BATCH_WINDOW, BatchNumbers, EvictedValue

__all__ = ["main", "state_row"]

HORIZON_S = 7 * 86_400


def state_row(n: int, *, numbered: bool) -> tuple[int, int, int]:
    """After ``n`` values in batches of :data:`~bench.service.BATCH` on ``bench.core``'s value
    stream: (bytes kept to recognise a resend, marks kept, values a resend is recognised for)."""
    path = prepare_values(n, BATCH, numbered=numbered)
    path.run()
    assert path.core is not None
    stores = path.core.stores
    marks = [v for v in stores.releases.values() if isinstance(v, EvictedValue)]
    if numbered:
        nums = stores.streams["v"].batch_numbers
        assert nums is not None and nums.through == n // BATCH
        return len(nums.model_dump_json()), len(marks), n
    return sum(len(encode_value(v)) for v in marks), len(marks), len(marks)


def _window_bytes() -> int:
    """A full window of numbers above a gap: the most a numbered stream keeps."""
    top = 2**40
    worst = BatchNumbers(through=top, above=[top + 2 + i for i in range(BATCH_WINDOW - 1)])
    return len(worst.model_dump_json())


def _cpu(runs: int, n: int) -> list[tuple[Measure, Measure]]:
    """(unnumbered, numbered) per run, alternated."""
    out = []
    for _ in range(runs):
        plain = measure(prepare_values(n, BATCH))
        numbered = measure(prepare_values(n, BATCH, numbered=True))
        out.append((plain, numbered))
    return out


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = [160, 1_600] if args.quick else [160, 1_600, 16_000]
    runs, n = (1, 320) if args.quick else (args.runs, 3_200)
    machine = Machine.now()
    print("Bytes a stream keeps to recognise a resend, numbered batches and not\n")
    print(
        "| values published | rate if within 7 days | unnumbered: marks kept, bytes | "
        "recognised for the last | numbered: bytes | recognised for the last |"
    )
    print("|---|---|---|---|---|---|")
    for size in sizes:
        m_bytes, marks, m_reach = state_row(size, numbered=False)
        n_bytes, _, n_reach = state_row(size, numbered=True)
        print(
            f"| {size:,} | {size / HORIZON_S:.4f}/s | {marks:,}, {m_bytes:,} B | "
            f"{m_reach:,} values | {n_bytes} B | {n_reach:,} values (all) |"
        )
    print(
        f"\nMarks are capped at {Caps().marks:,} per stream (past it the reach shrinks with the "
        f"rate); a numbered stream keeps at most {_window_bytes():,} B (a full window of "
        f"{BATCH_WINDOW} numbers above a gap), in its own record.\n"
    )
    print(f"Core CPU per value, {BATCH} values per batch, {n:,} values, {runs} runs alternated:\n")
    print("| path | core ÷ floor, min / med / max | numbered ÷ unnumbered (core µs) |")
    print("|---|---|---|")
    pairs = _cpu(runs, n)
    ratio = [b.core_us / a.core_us for a, b in pairs]
    print(f"| unnumbered | {_spread([a.core_us / a.floor_us for a, _ in pairs])} | |")
    print(
        f"| numbered | {_spread([b.core_us / b.floor_us for _, b in pairs])} | {_spread(ratio)} |"
    )
    print()
    print(machine.line())


if __name__ == "__main__":
    main()
