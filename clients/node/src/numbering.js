// A seller's numbering of its value batches, per stream (docs/protocol.md §6.4.1), as the
// Python client's (streams/clients/numbering.py): learnt from the market, never kept on disk. A
// process numbers a stream's batches 0 until the first answer to one says where the numbering
// stands (`next_batch_seq`, `missing_batch_seqs`); a number is used again only once the market
// said it did not take it (a refusal, or a line `rejected`), never while its batch may still be
// taken (no answer yet). A market of an earlier version refuses the field (`invalid_event` naming
// `batch_seq`): the stream's batches then go unnumbered.

/** The refusal of a number too far ahead; its details say where the numbering stands. */
export const OUT_OF_WINDOW = 'batch_seq_out_of_window';

export class Numbering {
  constructor() {
    this.streams = new Map(); // stream id → { following, free: Set, held: Set }
    this.unnumbered = new Set(); // streams of a market that numbers no batch
  }

  /** The number of the next batch of `streamId`: 0 until the market said, then the lowest free (null: none). */
  take(streamId) {
    if (this.unnumbered.has(streamId)) return null;
    const s = this.streams.get(streamId);
    if (!s) return 0;
    let n;
    if (s.free.size) {
      n = Math.min(...s.free);
      s.free.delete(n);
    } else {
      n = s.following++;
    }
    s.held.add(n);
    return n;
  }

  /**
   * The batch numbered `n` of `streamId` was answered: `answer` the `values_accepted`, or the
   * refusal's document (`{reason, message, details}`), or null when no answer came (the number
   * may be taken). Returns whether to send the batch again numbered anew (its number was out of
   * the window, or the market numbers none).
   */
  settle(streamId, n, answer) {
    if (n === 0 && answer?.reason === 'invalid_event' && String(answer.message ?? '').includes('batch_seq')) {
      this.unnumbered.add(streamId);
      return true;
    }
    const s = this.streams.get(streamId);
    if (n == null || n === 0) {
      if (!s && answer?.type === 'values_accepted' && Number.isInteger(answer.next_batch_seq)) {
        this.streams.set(streamId, { following: answer.next_batch_seq, free: new Set(answer.missing_batch_seqs ?? []), held: new Set() });
      }
      return false;
    }
    if (!s || !s.held.has(n)) return false;
    s.held.delete(n);
    if (answer?.reason === OUT_OF_WINDOW) {
      for (const m of answer.details?.missing ?? []) if (Number.isInteger(m) && m > 0 && !s.held.has(m)) s.free.add(m);
      if (Number.isInteger(answer.details?.next)) s.following = Math.max(s.following, answer.details.next);
      return true;
    }
    if (answer && !(answer.type === 'values_accepted' && answer.outcomes.every((o) => o.status === 'accepted'))) s.free.add(n);
    return false;
  }
}
