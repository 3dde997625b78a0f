// The Kafka layer: send signed events to their partitions, read answers, verify before believing
// (docs/protocol.md §8, §12).
import { randomBytes } from 'node:crypto';
import { Kafka, logLevel, AssignerProtocol } from 'kafkajs';
import { utf8, sha256Of, toHex } from './bytes.js';
import { signEvent, marketRef } from './signing.js';
import { solveWork, DEFAULT_WORK_BITS, MAX_WORK_BITS } from './work.js';
import { partitionOf } from './partition.js';
import { verifyAnswer, namedAnswer } from './answers.js';
import { sealBatch } from './sealing.js';
import { Numbering } from './numbering.js';
import { verifyOutcome, ReceiptInvalid } from './receipts.js';
import { keyId, decodePublicKey } from './keys.js';
import { readRoot, trustedKey, inboxMode } from './root.js';
import { InboxOpener } from './opening.js';
import { TopicInbox, SharedInbox } from './inbox.js';

/** The market said no: `reason` is the code of §9. */
export class Refused extends Error {
  constructor(reason, message, answer) {
    super(`${reason}: ${message}`);
    this.reason = reason;
    this.detail = message;
    this.answer = answer;
  }
}

/** No answer in time (the event may not have been read yet: resending the same bytes is safe). */
export class TimedOut extends Error {}

/**
 * A partition assigner giving the group's members `partitions` of `topic` alone: a v2 inbox's
 * reader reads its routes' partitions, not everyone's (§8.5.5).
 */
const onlyPartitions = (topic, partitions) => () => ({
  name: 'EmarketPartitions',
  version: 0,
  async assign({ members }) {
    const assignment = AssignerProtocol.MemberAssignment.encode({ version: 0, assignment: { [topic]: partitions } });
    return members.map(({ memberId }) => ({ memberId, memberAssignment: assignment }));
  },
  protocol({ topics }) {
    return { name: 'EmarketPartitions', metadata: AssignerProtocol.MemberMetadata.encode({ version: 0, topics }) };
  },
});

/**
 * A topic (or some of its `partitions`) read from its beginning into memory by a consumer of a
 * fresh group.
 */
class TopicReader {
  constructor(kafka, topic, partitions = null) {
    this.topic = topic;
    this.records = [];
    this.waiters = new Set();
    this.consumer = kafka.consumer({
      ...(partitions ? { partitionAssigners: [onlyPartitions(topic, partitions)] } : {}),
      groupId: `emarket-node-${toHex(randomBytes(8))}`,
      sessionTimeout: 2000,
      heartbeatInterval: 500,
      rebalanceTimeout: 2000,
      maxWaitTimeInMs: 200,
      allowAutoTopicCreation: false,
      retry: { retries: 3 },
    });
  }

  async start() {
    await this.consumer.connect();
    await this.consumer.subscribe({ topic: this.topic, fromBeginning: true });
    this.behind = new Map(); // partition -> high watermark not yet read up to
    await this.consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch }) => {
        for (const message of batch.messages) this.records.push({ ...message, partition: batch.partition });
        // The fetch response's high watermark is right even where "latest" offsets are not.
        const next = batch.messages.length ? Number(batch.messages[batch.messages.length - 1].offset) + 1 : 0;
        this.behind.set(batch.partition, Number(batch.highWatermark) > next);
        for (const w of this.waiters) w();
      },
    });
    return this;
  }

  /** Wait (at most `ms`) until every fetched partition is read to its high watermark. */
  async caughtUp(ms) {
    const deadline = Date.now() + ms;
    while (Date.now() < deadline && (this.behind.size === 0 || [...this.behind.values()].some(Boolean))) {
      await new Promise((res) => setTimeout(res, 50));
    }
  }

  /** The first record (from `from`) for which `pick` returns a result, within `ms`. */
  async find(pick, ms, from = 0) {
    const deadline = Date.now() + ms;
    let seen = from;
    for (;;) {
      for (; seen < this.records.length; seen++) {
        const got = pick(this.records[seen]);
        if (got !== undefined) return got;
      }
      const left = deadline - Date.now();
      if (left <= 0) return undefined;
      await new Promise((resolve) => {
        const w = () => {
          this.waiters.delete(w);
          clearTimeout(t);
          resolve();
        };
        const t = setTimeout(w, left);
        this.waiters.add(w);
      });
    }
  }

  async stop() {
    await this.consumer.disconnect().catch(() => {});
  }
}

const INPUT = { open_account: 'accounts', rotate_keys: 'accounts', register_stream: 'registrations', values: 'values', purchase: 'purchases', quote: 'purchases', reserve: 'purchases' };
const ID_FIELD = { accounts: 'account_id', registrations: 'stream_id', values: 'stream_id', purchases: 'stream_id' };

/**
 * A party's connection to one market. Every answer it returns carried the market's signature
 * for the inbox it was read from and for the bytes this client sent (§12); anything else in
 * the inbox is reported to `warn` and skipped.
 */
export class MarketClient {
  /**
   * @param {object} o
   * @param {string} o.broker host:port (a `kafka://` prefix is accepted)
   * @param {string} o.prefix the market's topic prefix (§8.1)
   * @param {import('./keys.js').Party} [o.party] who signs
   * @param {string} [o.marketPublicKey] the market's Ed25519 key (base64); else read from `<p>.market`
   * @param {number} [o.timeoutMs] how long to wait for an answer
   * @param {(msg: string) => void} [o.warn] where skipped messages are reported
   */
  constructor({ broker, prefix, party = null, marketPublicKey = null, timeoutMs = 30000, warn = (m) => console.error(`warning: ${m}`) }) {
    this.prefix = prefix;
    this.party = party;
    this.pinnedKey = marketPublicKey || null;
    this.marketPublicKey = this.pinnedKey;
    this.timeoutMs = timeoutMs;
    this.warn = warn;
    this.kafka = new Kafka({
      clientId: 'epsilon-market-node',
      brokers: [broker.replace(/^kafka:\/\//, '')],
      logLevel: logLevel.NOTHING,
      retry: { retries: 5, initialRetryTime: 100 },
    });
    this.producer = this.kafka.producer({ allowAutoTopicCreation: false });
    this.admin = this.kafka.admin();
    this.readers = new Map();
    this.partitions = new Map();
    this.warned = new Set();
    this.views = new Map();
    this.inboxes = { version: 1 };

    this.numbering = new Numbering(); // the numbers of this process's value batches (§6.4.1)
  }

  topic(name) {
    return `${this.prefix}.${name}`;
  }

  /** The v1 inbox topic of an account (§8.1); a v2 market has none (`inboxView`). */
  inbox(accountId = this.party.accountId) {
    return this.topic(`inbox.${accountId}`);
  }

  /**
   * This party's inbox as the market's identity says it is kept (§8.5.1): its own topic (v1),
   * or the routes of every sealing key in `keys` (default: the party's current and retired
   * ones) on `<p>.inbox` (v2). One view per set of keys, so its records are opened once.
   */
  inboxView(keys = this.party.sealingKeys()) {
    if (this.inboxes.version !== 2) return new TopicInbox(this, this.party.accountId);
    const id = `${this.party.accountId}/${keys.map((k) => k.sealingKey).join(',')}`;
    if (!this.views.has(id)) this.views.set(id, new SharedInbox(this, this.party.accountId, keys, this.inboxes));
    return this.views.get(id);
  }

  /**
   * Where this party's inbox is, for a person: its topic (v1), or the partition of `<p>.inbox`
   * and the route its records are keyed by (v2: the current sealing key's).
   */
  inboxWhere() {
    const view = this.inboxView();
    if (!(view instanceof SharedInbox)) return view.topic;
    const [r] = view.routes.values();
    return r ? `${view.topic} partition ${r.partition}, records keyed ${r.route}` : `${view.topic} (none: no sealing key)`;
  }

  /** Report `message` to `warn` once per `where`. */
  warnOnce(where, message) {
    if (this.warned.has(where)) return;
    this.warned.add(where);
    this.warn(message);
  }

  async connect() {
    await this.producer.connect();
    await this.admin.connect();
    this.marketPublicKey = await this.readMarketKey();
    return this;
  }

  async close() {
    this.closed = true;
    for (const r of this.readers.values()) await (await r.catch(() => null))?.stop();
    await this.producer.disconnect().catch(() => {});
    await this.admin.disconnect().catch(() => {});
  }

  async topicExists(topic) {
    return (await this.admin.listTopics()).includes(topic);
  }

  /**
   * A reader of `topic` (or of its `partitions` alone) from its beginning, shared by every wait
   * on that topic.
   */
  async reader(topic, partitions = null) {
    if (this.closed) throw new Error('the client is closed');
    const id = partitions ? `${topic}#${partitions.join(',')}` : topic;
    if (!this.readers.has(id)) {
      const r = new TopicReader(this.kafka, topic, partitions);
      this.readers.set(id, r.start().then(() => r));
    }
    return this.readers.get(id);
  }

  /**
   * The market key this client trusts (§12.1.1): the market's trust root, the first record of
   * partition 0 of `<p>.market` whatever it is, must be a market identity; its key must be the
   * pinned one (`marketPublicKey`) if given, else it is trusted on first use, with a warning.
   * Throws MarketRootError (its `reason` says why) when the root cannot be trusted.
   */
  async readMarketKey() {
    const topic = this.topic('market');
    const pinned = this.pinnedKey;
    if (pinned) decodePublicKey(pinned);
    if (!(await this.topicExists(topic))) throw new Error(`${topic} does not exist: no market with prefix ${this.prefix}`);
    const r = await this.reader(topic);
    const first = await r.find((rec) => (rec.partition === 0 ? rec : undefined), this.timeoutMs);
    if (!first) throw new TimedOut(`no identity record on ${topic}: has a worker of this market started?`);
    const identity = readRoot(topic, Number(first.offset), first.value);
    const key = trustedKey(topic, identity, pinned);
    this.inboxes = inboxMode(identity);
    if (!pinned) this.warn(`trusting the market key ${keyId(key)} (${key}) that ${topic} names, on first use: nothing proves it is the market's. Pin it: --market-key ${key} (EMARKET_MARKET_KEY, marketPublicKey)`);
    return key;
  }

  async partitionCount(topic) {
    if (!this.partitions.has(topic)) {
      const md = await this.admin.fetchTopicMetadata({ topics: [topic] });
      this.partitions.set(topic, md.topics[0].partitions.length);
    }
    return this.partitions.get(topic);
  }

  /** Sign `event` as this party and write it to its topic and partition (§8.1, §8.2). */
  async send(event, { sign = true, newParty } = {}) {
    const topic = this.topic(INPUT[event.type]);
    const signed = sign
      ? signEvent(event, { market: marketRef(this.prefix, keyId(this.marketPublicKey)), seed: this.party.signingSeed, keyId: this.party.keyId, generation: this.party.keyVersion, newSeed: newParty?.signingSeed })
      : event;
    const bytes = Buffer.from(utf8(JSON.stringify(signed)));
    const id = signed[ID_FIELD[INPUT[event.type]]];
    const partition = partitionOf(id, await this.partitionCount(topic));
    const meta = await this.producer.send({ topic, acks: -1, messages: [{ key: id, value: bytes, partition }] });
    // where the record was written: a refusal is ours only if it names this record (§12.5)
    const offset = Number(meta?.[0]?.baseOffset);
    return { event: signed, bytes, request: toHex(sha256Of(bytes)), topic, partition, offset };
  }

  /** Check a record of `topic`; returns its parsed value when the market signed it, else warns. */
  believe(topic, rec) {
    const v = verifyAnswer({ prefix: this.prefix, topic, value: rec.value, headers: rec.headers, marketPublicKey: this.marketPublicKey });
    if (!v.ok) {
      this.warnOnce(`${topic}@${rec.offset}`, `ignored a message on ${topic} at offset ${rec.offset} not signed by the market (${v.why})`);
      return undefined;
    }
    try {
      return { doc: JSON.parse(rec.value.toString('utf8')), request: v.request, offset: rec.offset };
    } catch {
      this.warn(`ignored a signed message on ${topic} at offset ${rec.offset} that is not JSON`);
      return undefined;
    }
  }

  /**
   * The refusal record of the record `sent` (§12.5), if the market wrote one: keyed by its
   * digest, and naming the topic, partition and offset it was written at. Anyone may copy the
   * same bytes to another topic or write them again, where the market refuses them under the
   * same key: that refusal is not ours.
   */
  async refusal(sent, ms) {
    const topic = this.topic('refusals');
    if (!(await this.topicExists(topic))) return undefined;
    const r = await this.reader(topic);
    return r.find((rec) => {
      if (rec.key?.toString('latin1') !== sent.request) return undefined;
      const got = this.believe(topic, rec);
      if (!got || got.request !== sent.request) return undefined;
      const d = got.doc;
      const ours = d.source_topic === sent.topic && d.source_partition === sent.partition && d.source_offset === sent.offset;
      return ours ? d : undefined;
    }, ms);
  }

  /**
   * Wait for the answer in this party's inbox bound to `sent` (§12.4), for which `accept`
   * returns true; a rejection bound to it throws Refused. Meanwhile a refusal record on
   * `<p>.refusals` (an event no account was proven to sign) throws too.
   */
  async answer(sent, accept = () => true, { inbox = this.inboxView(), ms = this.timeoutMs, cancel = { done: false } } = {}) {
    const deadline = Date.now() + ms;
    let refusedAt = null;
    while (Date.now() < deadline && !cancel.done) {
      if (await inbox.ready()) {
        const got = await inbox.find((b) => {
          if (b.request !== sent.request) return undefined;
          // a rejection of a copy of these bytes someone wrote to another topic is not ours
          if (b.doc.type === 'rejection') return b.doc.source_topic === sent.topic ? b : undefined;
          return accept(b.doc) ? b : undefined;
        }, Math.min(500, deadline - Date.now()));
        if (got) {
          if (got.doc.type === 'rejection') throw new Refused(got.doc.reason, got.doc.message, got.doc);
          return got.doc;
        }
      } else {
        await new Promise((res) => setTimeout(res, 200));
      }
      const ref = await this.refusal(sent, 50);
      if (ref) {
        // The inbox's rejection of the same bytes says more: wait a second for it (§12.5).
        refusedAt ??= Date.now();
        if (Date.now() - refusedAt > 1000) throw new Refused(ref.reason, ref.message, ref);
      }
    }
    throw new TimedOut(`no answer to ${sent.event.type} within ${ms} ms (resending the same bytes is safe)`);
  }

  /**
   * Open this party's account (§6.1), with the operators' `invitation` (§6.1.1) where the market
   * opens accounts by invitation only; returns the `account` answer, checked to pin our keys.
   */
  async openAccount({ openedAtMs = Date.now(), invitation } = {}) {
    const p = this.party;
    this.needSealingKey(p, 'open an account without a sealing key', 'a key file made by keygen without --no-sealing');
    let acc;
    for (;;) {
      // an open market asks proof of work (§6.1.2): none at first, then its default, then more
      const bits = this.workBits ?? 0;
      const event = { type: 'open_account', account_id: p.accountId, signing_key: p.signingKey, sealing_key: p.sealingKey, opened_at_ms: openedAtMs };
      if (invitation) event.invitation = invitation;
      if (bits) event.work = solveWork(this.prefix, p.accountId, p.signingKey, bits);
      const sent = await this.send(event);
      try {
        acc = await this.answer(sent, (d) => d.type === 'account');
        break;
      } catch (e) {
        if (!(e instanceof Refused && e.reason === 'more_work' && bits < MAX_WORK_BITS)) throw e;
        this.workBits = bits < DEFAULT_WORK_BITS ? DEFAULT_WORK_BITS : bits + 2;
      }
    }
    if (acc.account_id !== p.accountId || acc.signing_key !== p.signingKey || (acc.sealing_key ?? null) !== p.sealingKey) {
      throw new Refused('account_exists', `account ${p.accountId} belongs to another key`, acc);
    }
    return acc;
  }

  /**
   * A v2 market refuses accounts without a sealing key (`encryption_required`, §8.5.2): said
   * here before anything is sent, with what to do instead.
   */
  needSealingKey(party, what, instead) {
    if (this.inboxes.version === 2 && !party.sealingKey) {
      throw new Refused('encryption_required', `this market keeps v2 inboxes (docs/protocol.md §8.5), sealed to each account's sealing key: it refuses to ${what}; use ${instead}`);
    }
  }

  /**
   * Rotate this party's keys (§6.2) to `next` (a Party of the same account, fresh keys): signed
   * by the current key and by the new one, at version current + 1. On the market's `account`
   * answer this client signs with the new keys; returns `{account, party}`.
   */
  async rotateKeys(next, { rotatedAtMs = Date.now() } = {}) {
    const p = this.party;
    this.needSealingKey(next, 'rotate to keys without a sealing key', 'account rotate without --no-sealing');
    const version = p.keyVersion + 1;
    const sent = await this.send(
      { type: 'rotate_keys', account_id: p.accountId, version, signing_key: next.signingKey, sealing_key: next.sealingKey, rotated_at_ms: rotatedAtMs },
      { newParty: next },
    );
    // a v2 market answers under the new key's route, a refusal under the old one's (§8.5.3)
    const inbox = this.inboxView([...next.sealingKeys(), ...p.sealingKeys()]);
    const acc = await this.answer(sent, (d) => d.type === 'account' && d.version === version, { inbox });
    if (acc.signing_key !== next.signingKey || (acc.sealing_key ?? null) !== next.sealingKey) {
      throw new Refused('stale_key_version', `account ${p.accountId} is at other keys than the rotation's`, acc);
    }
    next.keyVersion = version;
    next.previous = p.retiring(p.keyVersion).map((k) => ({ ...k })); // what was sealed to the old keys still opens (§5.2)
    this.party = next;
    return { account: acc, party: next };
  }

  /** The catalog entry of `streamId` (§8.3), or undefined within `ms`. */
  async catalogEntry(streamId, ms = this.timeoutMs, accept = () => true) {
    const topic = this.topic('catalog');
    const deadline = Date.now() + ms;
    while (!(await this.topicExists(topic))) {
      if (Date.now() > deadline) return undefined;
      await new Promise((res) => setTimeout(res, 200));
    }
    const r = await this.reader(topic);
    let last;
    await r.find((rec) => {
      const d = this.signedEntry(rec);
      if (d?.registration?.stream_id === streamId && accept(d)) last = d;
      return undefined;
    }, 0);
    if (last) return last;
    return r.find((rec) => {
      const d = this.signedEntry(rec);
      return d?.registration?.stream_id === streamId && accept(d) ? d : undefined;
    }, Math.max(0, deadline - Date.now()));
  }

  /**
   * A catalog record's entry if the market signed it for the catalog topic (§12.3): an entry
   * names the key sellers seal values to, and anyone may write to the topic. Else undefined.
   */
  signedEntry(rec) {
    if (!rec.value) return undefined;
    const topic = this.topic('catalog');
    const v = verifyAnswer({ prefix: this.prefix, topic, value: rec.value, headers: rec.headers, marketPublicKey: this.marketPublicKey });
    if (!v.ok) return undefined;
    try {
      return JSON.parse(rec.value.toString('utf8'));
    } catch {
      return undefined;
    }
  }

  /** Register a stream (§6.3); the acceptance is its catalog entry, a refusal our inbox's. */
  async register(registration) {
    const sent = await this.send({ type: 'register_stream', seller_id: this.party.accountId, ...registration });
    const same = (d) => d.registration?.signature === sent.event.signature;
    const cancel = { done: false };
    const refused = this.answer(sent, () => false, { cancel }).then(() => ({}), (err) => ({ err }));
    const race = await Promise.race([
      this.catalogEntry(registration.stream_id, this.timeoutMs, same).then((d) => ({ entry: d })),
      refused,
    ]);
    cancel.done = true;
    await refused;
    if (race.err) throw race.err;
    if (!race.entry) throw new TimedOut(`no catalog entry for ${registration.stream_id}`);
    this.checkCatalogKey(race.entry);
    return race.entry;
  }

  /**
   * A sealing key is believed only from catalog entries the market signed (§12.3), and only if
   * every such entry names this one: a market has one sealing key.
   */
  async checkSealingKey(sealingKey) {
    const r = await this.reader(this.topic('catalog'));
    await r.caughtUp(3000);
    const seen = new Set();
    for (const rec of r.records) {
      const d = this.signedEntry(rec);
      if (d?.market_public_key === this.marketPublicKey && d.market_sealing_key) seen.add(d.market_sealing_key);
    }
    if (!sealingKey || seen.size !== 1 || !seen.has(sealingKey)) {
      throw new Error(`the catalog names ${seen.size} market sealing keys for the trusted market key: refusing to seal values to any of them`);
    }
    // a v2 market's identity names its sealing key, and the catalog's is the same (§8.5.1)
    if (this.inboxes.version === 2 && sealingKey !== this.inboxes.sealingKey) {
      throw new Error(`the catalog names the market sealing key ${sealingKey}, the market's identity ${this.inboxes.sealingKey}: refusing to seal values to either`);
    }
  }

  checkCatalogKey(entry) {
    if (entry.market_public_key !== this.marketPublicKey) {
      throw new Error(`the catalog entry of ${entry.registration.stream_id} names another market key than the one trusted`);
    }
  }

  /**
   * Publish value items `[{value_id, values, keys?, published_at_ms?}]` to a stream, sealed to
   * the market's key from its catalog entry (§4.5). Returns the `values_accepted` answer.
   */
  async publish(streamId, items, { clear = false, renumber = true } = {}) {
    const sent = await this.sendValues(streamId, items, { clear });
    let answer;
    try {
      answer = await this.answer(sent, (d) => d.type === 'values_accepted');
    } catch (err) {
      // a number too far ahead (batches of an earlier process lost), or a market that numbers
      // no batch: numbered anew, sent once more
      if (this.settleValues(sent, err) && renumber) return this.publish(streamId, items, { clear, renumber: false });
      throw err;
    }
    this.settleValues(sent, answer);
    return answer;
  }

  /**
   * Tell the numbering (§6.4.1) the answer to a batch `sendValues` sent: the `values_accepted`,
   * or the error (a Refused carries the refusal; any other error: no answer). Returns whether
   * to send the batch again numbered anew.
   */
  settleValues(sent, answer) {
    const got = answer instanceof Refused ? answer.answer ?? { reason: answer.reason, message: answer.detail } : answer instanceof Error ? null : answer;
    return this.numbering.settle(sent.event.stream_id, sent.event.batch_seq ?? null, got);
  }

  /**
   * Seal and send one batch of value items (as `publish`) without waiting for its answer;
   * returns what `send` returns, for `answer`. A ValueBatcher (src/batching.js) keeps several
   * such batches in flight.
   */
  async sendValues(streamId, items, { clear = false } = {}) {
    const now = Date.now();
    const full = items.map((it) => ({ ...it, published_at_ms: it.published_at_ms ?? now }));
    let event;
    if (clear) {
      event = { type: 'values', stream_id: streamId, seller_id: this.party.accountId, items: full };
    } else {
      const entry = await this.catalogEntry(streamId);
      if (!entry) throw new Refused('unknown_stream', `${streamId} is not in the catalog`);
      this.checkCatalogKey(entry);
      await this.checkSealingKey(entry.market_sealing_key);
      event = sealBatch({ prefix: this.prefix, marketSealingKey: entry.market_sealing_key, streamId, sellerId: this.party.accountId, items: full });
    }
    const n = this.numbering.take(streamId);
    return this.send(n == null ? event : { ...event, batch_seq: n });
  }

  /** Ask what a purchase would cost (§6.7). */
  async quote(streamId, { quoteId = `q-${toHex(randomBytes(6))}`, targetLevel = null, accuracy = null } = {}) {
    const sent = await this.send({ type: 'quote', quote_id: quoteId, buyer_id: this.party.accountId, stream_id: streamId, target_level: targetLevel, requested_at_ms: Date.now(), accuracy });
    return this.answer(sent, (d) => d.type === 'quote' && d.quote_id === quoteId);
  }

  /**
   * Hold a purchase's terms — level, price, privacy room — for `holdMs` (1,000 to 120,000; §6.9):
   * returns the market-signed `reservation` (its `expires_at_ms` by the market's clock); a
   * refusal throws. Buy on it with `buy(streamId, { reservationId, maxPriceMinor })`.
   */
  async reserve(streamId, { holdMs, reservationId = `r-${toHex(randomBytes(6))}`, targetLevel = null, accuracy = null } = {}) {
    if (!Number.isInteger(holdMs) || holdMs < 1000 || holdMs > 120000) {
      throw new RangeError(`holdMs: how long to hold the terms, 1000 to 120000 ms, not ${holdMs}`);
    }
    const sent = await this.send({
      type: 'reserve', reservation_id: reservationId, buyer_id: this.party.accountId, stream_id: streamId,
      target_level: targetLevel, hold_ms: holdMs, requested_at_ms: Date.now(), accuracy,
    });
    return this.answer(sent, (d) => d.type === 'reservation' && d.reservation_id === reservationId);
  }

  /**
   * Buy a step (§6.5): returns the `purchase_fulfilled` answer with its releases opened and its
   * receipt verified against the releases (§11); `receipt_invalid` throws. With `reservationId`
   * it buys that reservation's level at its price (§6.9).
   */
  async buy(streamId, { purchaseId = `p-${toHex(randomBytes(6))}`, maxPriceMinor, targetLevel = null, accuracy = null, mostAccurate = false, currency = 'EUR', reservationId = null } = {}) {
    const sent = await this.send({
      type: 'purchase', purchase_id: purchaseId, buyer_id: this.party.accountId, stream_id: streamId, target_level: targetLevel,
      max_price_minor: maxPriceMinor, currency, requested_at_ms: Date.now(), accuracy, most_accurate: mostAccurate,
      ...(reservationId == null ? {} : { reservation_id: reservationId }),
    });
    let ans;
    try {
      ans = await this.answer(sent, (d) => d.type === 'purchase_fulfilled' && d.purchase_id === purchaseId);
    } catch (err) {
      if (!(err instanceof Refused) || err.reason !== 'already_answered') throw err;
      // The market's earlier answer to this purchase id that the notice names is the answer
      // (§12.4): never the refusal of another request that used the id.
      ans = await this.earlierAnswer(purchaseId, streamId, err.answer);
      if (!ans) throw err;
      if (ans.type === 'rejection') throw new Refused(ans.reason, ans.message, ans);
    }
    return this.checkOutcome(ans);
  }

  /**
   * The market-signed earlier answer to `purchaseId` on `streamId` in the inbox that the
   * `already_answered` notice names (§12.4's resend rule: `namedAnswer`). Undefined if the
   * inbox holds none.
   */
  async earlierAnswer(purchaseId, streamId, notice) {
    const earlier = [];
    await this.inboxView().find(({ doc: d, valueSha256 }) => {
      if ((d.purchase_id !== purchaseId && d.request_id !== purchaseId) || d.stream_id !== streamId) return undefined;
      if (d.type === 'purchase_fulfilled' && d.buyer_id !== this.party.accountId) return undefined;
      if (d.type === 'rejection' && d.reason === 'already_answered') return undefined;
      earlier.push({ doc: d, valueSha256 });
      return undefined;
    }, 0);
    return namedAnswer(notice, earlier);
  }

  /** Open a purchase's releases and verify its receipt; returns the opened event. */
  checkOutcome(ans, opened = null) {
    let sealedCiphertext;
    if (ans.sealed) {
      if (!opened) {
        // the current sealing key or a retired one: an earlier outcome answered again after a rotation is sealed to the key of its time
        const got = new InboxOpener(this.party.sealingKeys()).open(ans);
        if (got.unopened) throw new Error(`the answer cannot be opened with this key file: ${got.unopened.reason}`);
        opened = got.doc;
      }
      sealedCiphertext = ans.sealed.ciphertext;
    } else opened = ans;
    verifyOutcome(opened, this.marketPublicKey, { sealedCiphertext });
    return opened;
  }

  /**
   * Every message of this party's inbox the market signed, opened with every sealing key the
   * party holds (its current one and the retired ones of its key file, §5.2): answers and
   * subscription deliveries (`value_released`, `deliveries_withheld`). A sealed message no key
   * opens is kept as it came, with `_unopened: {reason, keyVersion, keyId, held}` (the key
   * version it was sealed under, whose key file opens it). Forged messages are warned about.
   */
  async inboxMessages({ ms = 1000, until = () => false } = {}) {
    const inbox = this.inboxView();
    const out = [];
    if (!(await inbox.ready())) return out;
    const opener = new InboxOpener(this.party.sealingKeys());
    await inbox.find((b) => {
      let { doc, unopened } = opener.open(b.doc);
      try {
        if (doc.type === 'purchase_fulfilled' && b.doc.sealed && !unopened) doc = this.checkOutcome(b.doc, doc);
      } catch (err) {
        this.warn(`${doc.type} at ${b.where}: ${err.message}`);
        return undefined;
      }
      out.push({ ...doc, _offset: Number(b.offset), _delivery: b.request === null, ...(unopened ? { _unopened: unopened } : {}) });
      return until(doc, out) ? true : undefined;
    }, ms);
    return out;
  }
}

export { ReceiptInvalid };
