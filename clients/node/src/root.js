// The market's trust root (docs/protocol.md §12.1.1): the first record of partition 0 of
// `<p>.market`, whatever it is, must be the market's identity (docs/schemas/market.schema.json);
// its key must be the pinned one if a key was given, else it is trusted on first use.
import { fromB64 } from './bytes.js';
import { keyId } from './keys.js';

/** The root cannot be trusted; `reason` is `tombstone`, `malformed`, `foreign` or `no_key`. */
export class MarketRootError extends Error {
  constructor(reason, message) {
    super(message);
    this.reason = reason;
  }
}

const HEX = (n) => new RegExp(`^[0-9a-f]{${n}}$`);
const KEY_RE = /^[A-Za-z0-9+/]{43}=$/;
const isInt = (x) => Number.isInteger(x);
const orNull = (check) => (x) => x === null || check(x);
const str = (re) => (x) => typeof x === 'string' && (!re || re.test(x));
/** docs/schemas/market.schema.json, field by field. */
const FIELDS = {
  type: (x) => x === 'market_identity',
  schema_version: (x) => x === 1,
  noise_secret_fingerprint: str(HEX(32)),
  noise_derivation: str(),
  noise_format: orNull(isInt),
  noise_check: str(HEX(64)),
  noise_check_discrete: orNull(str(HEX(64))),
  noise_check_histogram: orNull(str(HEX(64))),
  state_format: orNull(isInt),
  market_key_id: str(HEX(16)),
  market_public_key: orNull(str(KEY_RE)),
  inboxes: orNull((x) => x === 2),
  inbox_partitions: orNull((x) => isInt(x) && x >= 1 && x <= 1024),
  market_sealing_key: orNull(str(KEY_RE)),
  created_at_ms: (x) => isInt(x) && x >= 0 && x <= Number.MAX_SAFE_INTEGER,
};
const REQUIRED = ['noise_secret_fingerprint', 'noise_derivation', 'noise_check', 'market_key_id', 'created_at_ms'];

const remedy = (topic) =>
  'The first record of this topic is the market\'s identity for as long as the topic exists: someone wrote this one ' +
  `before the market's first worker did. If this market has served nothing yet, delete the topic ${topic} (or the ` +
  `broker's data) and start the worker again; else choose another prefix; and let only the market's workers write to ${topic} ` +
  '(ACLs, docs/operations.md)';

function problem(value) {
  let doc;
  try {
    doc = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(value));
  } catch (err) {
    return `not JSON: ${err.message}`;
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) return 'not a JSON object';
  for (const [k, v] of Object.entries(doc)) {
    if (!FIELDS[k]) return `${k}: not a field of a market identity`;
    if (!FIELDS[k](v)) return `${k}: not valid`;
  }
  for (const k of REQUIRED) if (!(k in doc)) return `${k}: missing`;
  return doc;
}

/** The market's identity from the root record (partition 0, `offset`, `value` or null). */
export function readRoot(topic, offset, value) {
  const where = `the first record of ${topic} (partition 0, offset ${offset})`;
  if (value === null || value === undefined) {
    throw new MarketRootError('tombstone', `${where} is a tombstone (a null value), not the market's identity: this market's trust root is spoiled. ${remedy(topic)}`);
  }
  const doc = problem(value);
  if (typeof doc === 'string') {
    throw new MarketRootError('malformed', `${where} is not a market identity (${value.length} bytes: ${doc}): this market's trust root is spoiled. ${remedy(topic)}`);
  }
  if (doc.market_public_key != null && keyId(doc.market_public_key) !== doc.market_key_id) {
    throw new MarketRootError('malformed', `${where} names key id ${doc.market_key_id} for a key whose id is ${keyId(doc.market_public_key)}: this market's trust root is spoiled. ${remedy(topic)}`);
  }
  if (doc.inboxes === 2 && (doc.inbox_partitions == null || doc.market_sealing_key == null)) {
    throw new MarketRootError('malformed', `${where} says the market has v2 inboxes but names no ${doc.inbox_partitions == null ? 'inbox_partitions' : 'market_sealing_key'}: its readers could not find their inboxes, so this market's trust root is spoiled. ${remedy(topic)}`);
  }
  return doc;
}

/**
 * The market's inboxes, as its identity says (§8.5.1): `{version: 1}` (a topic per account) or
 * `{version: 2, partitions, sealingKey}` (one topic of `partitions`, routes computed with the
 * market's X25519 `sealingKey`).
 */
export function inboxMode(ident) {
  if (ident?.inboxes !== 2) return { version: 1 };
  return { version: 2, partitions: ident.inbox_partitions, sealingKey: ident.market_sealing_key };
}

const sameKey = (a, b) => Buffer.from(fromB64(a)).equals(Buffer.from(fromB64(b)));

/** The key a client trusts: the pinned one if the root agrees, else the root's (on first use). */
export function trustedKey(topic, ident, pinned) {
  const published = ident.market_public_key ?? null;
  if (pinned) {
    if (published !== null && !sameKey(published, pinned)) {
      throw new MarketRootError('foreign', `the first record of ${topic} names the market key ${ident.market_key_id} (${published}), not the key this client was given (${keyId(pinned)}, ${pinned}): this is not the market you pinned, or someone wrote its identity before its first worker did. Check the prefix and broker, and the key the market's operators published`);
    }
    return pinned;
  }
  if (published === null) throw new MarketRootError('no_key', `${topic} publishes no market key (a market made before answers were signed): pass it (--market-key, EMARKET_MARKET_KEY)`);
  return published;
}

/** What a client concludes from a root record, in the form of the vectors of §12.1.1. */
export function rootVerdict(topic, value, pinned) {
  try {
    const key = trustedKey(topic, readRoot(topic, 0, value), pinned);
    return { verdict: pinned ? 'pinned' : 'trusted', key };
  } catch (err) {
    if (err instanceof MarketRootError) return { verdict: err.reason, key: null };
    throw err;
  }
}
