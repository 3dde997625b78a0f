// Where a party's inbox is and how its messages are believed (docs/protocol.md §8.3, §8.5, §12.3):
// a v1 inbox is a topic of the account's own, each record signed alone; a v2 inbox is the
// account's routes on the partitioned `<p>.inbox`, each record sealed to the account and signed
// over bytes naming it. Both give the same messages to the same answer logic:
// `{doc, request, valueSha256, offset, where}` (request: the R the message answers, null for a
// delivery or a sale).
import { requestDigest } from './answers.js';
import { inboxRoute, openInboxRecord, InboxRecordError } from './inbox_v2.js';

/** A v1 inbox: `<p>.inbox.<account_id>` (§8.1), every record under its `emarket-answer` header. */
export class TopicInbox {
  constructor(client, accountId) {
    this.client = client;
    this.topic = client.topic(`inbox.${accountId}`);
  }

  /** Whether there is an inbox to read yet (the market makes it when the account is opened). */
  async ready() {
    return this.client.topicExists(this.topic);
  }

  /** The first message (within `ms`) for which `pick` returns a result. */
  async find(pick, ms) {
    const r = await this.client.reader(this.topic);
    return r.find((rec) => {
      const b = this.client.believe(this.topic, rec);
      return b ? pick({ ...b, valueSha256: requestDigest(rec.value ?? new Uint8Array()), where: `${this.topic}@${rec.offset}` }) : undefined;
    }, ms);
  }
}

/**
 * A v2 inbox (§8.5.5): the routes of every sealing key held (`keys`: Party#sealingKeys(), the
 * current one and the retired ones), read on their partitions of `<p>.inbox`. Records under
 * other keys are skipped by key; one under a route that does not open, verify or name this
 * account is reported to the client's `warn` once and skipped.
 */
export class SharedInbox {
  constructor(client, accountId, keys, mode) {
    this.client = client;
    this.accountId = accountId;
    this.topic = client.topic('inbox');
    this.routes = new Map();
    for (const k of keys) {
      const r = inboxRoute({ prefix: client.prefix, accountId, sealingPrivate: k.sealingPrivate, marketSealingKey: mode.sealingKey, partitions: mode.partitions });
      this.routes.set(r.route, r);
    }
    this.partitions = [...new Set([...this.routes.values()].map((r) => r.partition))].sort((a, b) => a - b);
    this.opened = new WeakMap();
  }

  /** Whether there is anything to read: a route (an account without a sealing key has none) and the topic. */
  async ready() {
    return this.routes.size > 0 && this.client.topicExists(this.topic);
  }

  async find(pick, ms) {
    const r = await this.client.reader(this.topic, this.partitions);
    return r.find((rec) => {
      for (const m of this.messages(rec)) {
        const got = pick(m);
        if (got !== undefined) return got;
      }
      return undefined;
    }, ms);
  }

  /** The messages of one record, opened and checked once; none for another account's record. */
  messages(rec) {
    const route = this.routes.get(rec.key?.toString('latin1'));
    if (!route) return []; // another account's: skipped by its key alone
    let got = this.opened.get(rec);
    if (!got) {
      got = this.open(rec, route);
      this.opened.set(rec, got);
    }
    return got;
  }

  open(rec, route) {
    const where = `${this.topic}[${rec.partition}]@${rec.offset}`;
    const c = this.client;
    let messages;
    try {
      messages = openInboxRecord({ key: route.route, value: rec.value, route: route.route, sealKey: route.sealKey, prefix: c.prefix, accountId: this.accountId, marketPublicKey: c.marketPublicKey });
    } catch (err) {
      if (!(err instanceof InboxRecordError)) throw err;
      c.warnOnce(where, `ignored a record on ${where} under this account's route not written by the market to it (${err.message})`);
      return [];
    }
    const out = [];
    for (const m of messages) {
      try {
        out.push({ doc: JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(m.value)), request: m.request, valueSha256: requestDigest(m.value), offset: rec.offset, where });
      } catch {
        c.warnOnce(`${where}/${m.key}`, `ignored a signed message ${m.key} on ${where} that is not JSON`);
      }
    }
    return out;
  }
}
