// A seller's values gathered into batches (docs/protocol.md §4, §6.4): the market verifies one
// signature, opens one envelope and writes one answer per batch, so a value costs it about a
// third as much in a batch of 32 as alone. Values added to a ValueBatcher go out in one batch
// once it holds `maxValues`, or `maxDelayMs` after its first value, whichever comes first; the
// batches are sent in the order of their values and several wait for their answers at once.
// Each value's promise resolves to its own line of the market's answer.
import { Refused } from './kafka.js';

/** Values per batch by default: where the market's CPU per value stops falling. */
export const DEFAULT_MAX_VALUES = 32;
/** Milliseconds a value waits by default for others to share its batch. */
export const DEFAULT_MAX_DELAY_MS = 50;
/** Batches sent and not yet answered at most; `add` waits for room beyond twice as many queued. */
export const MAX_IN_FLIGHT = 32;
/** The protocol's bound on the items of a batch (§6.4). */
export const MAX_BATCH = 1000;

export class ValueBatcher {
  /**
   * @param {import('./kafka.js').MarketClient} client a connected client of the stream's seller
   * @param {string} streamId
   * @param {object} [o]
   * @param {number} [o.maxValues] values per batch, at most (1 … 1000; default 32)
   * @param {number} [o.maxDelayMs] longest a value waits for others (default 50 ms)
   * @param {boolean} [o.clear] send clear numbers (a market refuses them unless its operators accept them)
   * @param {(items: object[], answer: object) => void} [o.onAnswer] told of each batch answered
   */
  constructor(client, streamId, { maxValues = DEFAULT_MAX_VALUES, maxDelayMs = DEFAULT_MAX_DELAY_MS, clear = false, onAnswer = null } = {}) {
    if (!Number.isInteger(maxValues) || maxValues < 1 || maxValues > MAX_BATCH) throw new RangeError(`maxValues must be 1 to ${MAX_BATCH} (a batch's bound), got ${maxValues}`);
    if (!(maxDelayMs >= 0)) throw new RangeError(`maxDelayMs must be 0 or more, got ${maxDelayMs}`);
    Object.assign(this, { client, streamId, maxValues, maxDelayMs, clear, onAnswer });
    this.rows = [];
    this.timer = null;
    this.sending = Promise.resolve(); // batches are sent one after another, in order
    this.pending = new Set(); // every batch not answered yet, queued or sent
    this.flight = new Set(); // the batches sent and not answered yet
    this.closed = false;
  }

  /**
   * Queue one value `{value_id?, values, keys?, published_at_ms?}`; resolves once it is queued
   * to `{line}`, where `line` is a promise of the value's line of the market's answer
   * (`{value_id, status, reason?, message?}`; a batch refused whole gives each value a
   * `rejected` line with its reason; no answer in time rejects it with TimedOut).
   */
  async add(item) {
    if (this.closed) throw new Error('this batcher is closed: values go to an open one');
    const now = Date.now();
    const row = { ...item, value_id: item.value_id ?? `v-${now}-${Math.random().toString(16).slice(2, 10)}`, published_at_ms: item.published_at_ms ?? now };
    let settle;
    const line = new Promise((resolve, reject) => { settle = { resolve, reject }; });
    line.catch(() => {}); // the caller's to read; never an unhandled rejection
    this.rows.push({ row, settle });
    if (this.rows.length >= this.maxValues) this.cut();
    else if (this.rows.length === 1) this.timer = setTimeout(() => this.cut(), this.maxDelayMs);
    while (this.pending.size > 2 * MAX_IN_FLIGHT) await Promise.race(this.pending);
    return { line };
  }

  /** Send what was added and wait until every batch is answered. */
  async flush() {
    this.cut();
    while (this.pending.size) await Promise.allSettled([...this.pending]);
  }

  async close() {
    await this.flush();
    this.closed = true;
  }

  cut() {
    clearTimeout(this.timer);
    this.timer = null;
    if (!this.rows.length) return;
    const rows = this.rows;
    this.rows = [];
    const items = rows.map((r) => r.row);
    // sent after the batches before it; answered while later ones are sent
    const sent = this.sending.then(() => this.room()).then(() => this.client.sendValues(this.streamId, items, { clear: this.clear }));
    this.sending = sent.catch(() => {});
    const answered = sent.then((s) => {
      const got = this.client.answer(s, (d) => d.type === 'values_accepted').then(
        (a) => { this.client.settleValues(s, a); return a; },
        (err) => { err.renumber = this.client.settleValues(s, err); throw err; },
      );
      const flying = got.catch(() => {}).finally(() => this.flight.delete(flying));
      this.flight.add(flying);
      return got;
    });
    const done = answered
      .catch((err) => this.refusal(err, items))
      .then(
        (answer) => {
          this.onAnswer?.(items, answer);
          const lines = new Map(answer.outcomes.map((o) => [o.value_id, o]));
          for (const r of rows) r.settle.resolve(lines.get(r.row.value_id));
        },
        (err) => {
          for (const r of rows) r.settle.reject(err);
        },
      )
      .finally(() => this.pending.delete(done));
    this.pending.add(done);
  }

  /** Wait while MAX_IN_FLIGHT batches are sent and unanswered. */
  async room() {
    while (this.flight.size >= MAX_IN_FLIGHT) await Promise.race(this.flight);
  }

  /**
   * The answer a refused batch stands for: a batch too large for the stream now (many holders)
   * sent again in the parts it takes, later batches no larger; any other refusal of the whole
   * batch as a `rejected` line for each of its values. A timeout stays an error.
   */
  async refusal(err, items) {
    if (!(err instanceof Refused)) throw err;
    if (err.renumber) return this.client.publish(this.streamId, items, { clear: this.clear }); // numbered anew (§6.4.1)
    const size = err.answer?.details?.max_values;
    if (err.reason === 'batch_too_large' && Number.isInteger(size) && size > 0 && size < items.length) {
      this.maxValues = Math.min(this.maxValues, size);
      const outcomes = [];
      for (let k = 0; k < items.length; k += size) {
        const part = await this.client.publish(this.streamId, items.slice(k, k + size), { clear: this.clear });
        outcomes.push(...part.outcomes);
      }
      return { type: 'values_accepted', stream_id: this.streamId, outcomes };
    }
    return { type: 'values_accepted', stream_id: this.streamId, outcomes: items.map((it) => ({ value_id: it.value_id, status: 'rejected', reason: err.reason, message: err.detail })) };
  }
}


