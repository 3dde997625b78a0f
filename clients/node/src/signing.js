// Canonical bytes and signatures of every event a party sends (docs/protocol.md §2, §6).
import { ed25519 } from '@noble/curves/ed25519';
import { sha256 } from '@noble/hashes/sha2';
import { Items, utf8, toB64, fromB64, concat, checkInteger } from './bytes.js';

const Point = ed25519.Point;

const HEAD = concat(utf8('emarket-sig-v2'), Uint8Array.of(0));
const KEY_ID = /^[0-9a-f]{16}$/;

/**
 * The market a party signs for (§2): its topic `prefix` and `keyId`, the key id of its Ed25519
 * key (`market_key_id` of `<p>.market`). Markets started with the same defaults share a prefix,
 * never a key: what is signed for one verifies in no other.
 */
export function marketRef(prefix, keyId) {
  if (typeof prefix !== 'string') throw new Error('a market is named by its prefix and its key id');
  if (!KEY_ID.test(keyId ?? '')) throw new Error(`a market key id is 16 lower-case hex digits, got ${keyId}: pass the market's key id (market_key_id of <prefix>.market)`);
  return { prefix, keyId };
}

/** The common head `"emarket-sig-v2" ‖ 00 ‖ s(prefix) ‖ s(market key id) ‖ s(type) ‖ [i(generation)]` (§2). */
function head(market, type, generation) {
  const { prefix, keyId } = marketRef(market?.prefix, market?.keyId);
  const it = new Items(HEAD).s(prefix).s(keyId).s(type);
  const g = checkInteger(generation ?? 1, 'key version');
  if (g < 1) throw new Error('key version must be at least 1');
  if (g >= 2 && type !== 'open_account' && type !== 'rotate_keys') it.i(g, 'key version');
  return it;
}

function openAccount(it, e) {
  it.s(e.account_id).s(e.signing_key).sOrN(e.sealing_key).i(e.opened_at_ms, 'opened_at_ms');
}

function rotateKeys(it, e) {
  it.s(e.account_id).i(e.version, 'version').s(e.signing_key).sOrN(e.sealing_key);
  it.i(e.rotated_at_ms, 'rotated_at_ms');
}

/** Price table keys in increasing bytewise order of their UTF-8 (§2, §6.3). */
function byUtf8(a, b) {
  return Buffer.compare(Buffer.from(utf8(a)), Buffer.from(utf8(b)));
}

function pricing(it, p) {
  if (!p || typeof p !== 'object') throw new Error('pricing is required');
  it.s(p.kind);
  if (p.kind === 'table') {
    const keys = Object.keys(p.prices ?? {}).sort(byUtf8);
    it.i(keys.length);
    for (const k of keys) it.s(k).i(p.prices[k], 'price');
  } else if (p.kind === 'linear_level') {
    it.f(p.rate_per_level, 'rate_per_level');
  } else if (p.kind === 'linear_precision') {
    it.f(p.rate_per_precision, 'rate_per_precision');
  } else {
    throw new Error(`unknown pricing kind ${p.kind}`);
  }
}

function registerStream(it, e) {
  it.s(e.stream_id).s(e.seller_id).s(e.mechanism).f(e.sensitivity, 'sensitivity');
  it.i(e.dimension, 'dimension').v(e.steps, 'steps').f(e.cap, 'cap');
  it.i(e.retain_last ?? 16, 'retain_last').b(e.sealed ?? false);
  pricing(it, e.pricing);
  it.s(e.currency ?? 'EUR').s(e.description ?? '');
  if (e.window != null) {
    it.s(e.privacy_unit ?? 'event').i(e.window.duration_ms, 'window.duration_ms').f(e.window.cap, 'window.cap');
  }
  if (e.tree_height != null) it.s(e.product ?? 'values').i(e.tree_height, 'tree_height');
  if (e.histogram != null) {
    const h = e.histogram;
    it.s(e.product ?? 'values').s(h.key_space).iOrN(h.domain_size, 'domain_size').f(h.false_keys ?? 1.0, 'false_keys');
  }
  if (e.rappor_ones != null) it.s(e.product ?? 'values').i(e.rappor_ones, 'rappor_ones');
  if (e.buyer_share != null) it.s('buyer_share').f(e.buyer_share, 'buyer_share');
}

function values(it, e) {
  it.s(e.stream_id).s(e.seller_id).i(e.items.length);
  for (const item of e.items) {
    it.s(item.value_id).i(item.published_at_ms, 'published_at_ms').v(item.values ?? []);
    if (item.keys != null) {
      it.i(item.keys.length);
      for (const k of item.keys) it.s(k);
    }
  }
  if (e.sealed != null) it.s(e.sealed.alg).s(e.sealed.epk).s(e.sealed.nonce).s(e.sealed.ciphertext);
  if (e.batch_seq != null) it.i(e.batch_seq, 'batch_seq'); // numbered batches only (§6.4.1)
}

/** The accuracy target item `A` (§6.6). */
function accuracy(it, a) {
  if (a == null) return it.n();
  return it.b(true).fOrN(a.rmse, 'rmse').fOrN(a.half_width, 'half_width').f(a.confidence ?? 0.95, 'confidence');
}

function purchase(it, e) {
  it.s(e.purchase_id).s(e.buyer_id).s(e.stream_id).fOrN(e.target_level, 'target_level');
  it.i(e.max_price_minor, 'max_price_minor').s(e.currency ?? 'EUR').i(e.requested_at_ms, 'requested_at_ms');
  accuracy(it, e.accuracy);
  it.b(e.most_accurate ?? false);
  // only when named: the bytes of every other purchase are unchanged (§6.5)
  if (e.reservation_id != null) it.s(e.reservation_id);
}

function quote(it, e) {
  it.s(e.quote_id).s(e.buyer_id).s(e.stream_id).fOrN(e.target_level, 'target_level');
  it.i(e.requested_at_ms, 'requested_at_ms');
  accuracy(it, e.accuracy);
}

function reserve(it, e) {
  it.s(e.reservation_id).s(e.buyer_id).s(e.stream_id).fOrN(e.target_level, 'target_level');
  it.i(e.hold_ms, 'hold_ms').i(e.requested_at_ms, 'requested_at_ms');
  accuracy(it, e.accuracy);
}

const FIELDS = {
  open_account: openAccount,
  rotate_keys: rotateKeys,
  register_stream: registerStream,
  values,
  purchase,
  quote,
  reserve,
};

/** The event types of §6. */
export const EVENT_TYPES = Object.keys(FIELDS);

/**
 * The canonical bytes of `event` for `market` (`marketRef(prefix, keyId)`), signed at key
 * version `generation` (§2, §6). Omitted fields are signed as their defaults (§2.5).
 */
export function canonicalBytes(event, market, generation = 1) {
  const fields = FIELDS[event.type];
  if (!fields) throw new Error(`unknown event type ${event.type}`);
  const it = head(market, event.type, generation);
  fields(it, event);
  return it.bytes();
}

/** Ed25519 public key (32 bytes) of a 32-byte seed. */
export const ed25519Public = (seed) => ed25519.getPublicKey(seed);

/** Base64 of the Ed25519 signature of `message` (§5). */
export const signBytes = (seed, message) => toB64(ed25519.sign(message, seed));

/**
 * Whether `signature` (base64) verifies `message` under `publicKey` (32 bytes or base64), as
 * libsodium's strict verification says (§2): RFC 8032's equation with `S` < L, and neither the
 * key nor `R` of small order nor in non-canonical encoding (else `R` = identity, `S` = 0 would
 * verify every message under the identity key: a signature by nobody, §5.1).
 */
export function verifyBytes(publicKey, message, signature) {
  try {
    const pk = typeof publicKey === 'string' ? fromB64(publicKey) : publicKey;
    const sig = fromB64(signature);
    if (pk.length !== 32 || sig.length !== 64) return false;
    if (Point.fromHex(pk, false).isSmallOrder()) return false;
    if (Point.fromHex(sig.slice(0, 32), false).isSmallOrder()) return false;
    return ed25519.verify(sig, message, pk, { zip215: false });
  } catch {
    return false;
  }
}

/**
 * Whether `publicKey` (32 bytes or base64) may be an account's signing key (§5): the canonical
 * encoding of a point of the prime-order subgroup other than the identity, as libsodium's
 * `crypto_core_ed25519_is_valid_point` says. The market refuses any other (`invalid_key`).
 */
export function validSigningKey(publicKey) {
  try {
    const pk = typeof publicKey === 'string' ? fromB64(publicKey) : publicKey;
    if (pk.length !== 32) return false;
    const p = Point.fromHex(pk, false);
    return !p.isSmallOrder() && p.isTorsionFree();
  } catch {
    return false;
  }
}

/**
 * Sign `event` (a plain object with its `type`) for `market` (`marketRef`) with `seed` at
 * `generation`: returns a copy with
 * `key_id` and `signature` (and, for a rotation, `new_key_signature` by `newSeed`).
 */
export function signEvent(event, { market, seed, keyId, generation = 1, newSeed } = {}) {
  const out = { ...event };
  delete out.signature;
  delete out.new_key_signature;
  out.key_id = keyId;
  const msg = canonicalBytes(out, market, generation);
  out.signature = signBytes(seed, msg);
  if (event.type === 'rotate_keys') {
    if (!newSeed) throw new Error('a rotation is also signed by the new key (newSeed)');
    out.new_key_signature = signBytes(newSeed, msg);
  }
  return out;
}

/**
 * Whether a received `event` verifies for `market` under `publicKey` (base64) at `generation`: its canonical
 * bytes (with defaults) and its `signature`, and that `key_id` names that key.
 */
export function verifyEvent(event, market, publicKey, generation = 1) {
  try {
    const pk = fromB64(publicKey);
    const id = Buffer.from(sha256(pk)).toString('hex').slice(0, 16);
    if (event.key_id !== id) return false;
    return verifyBytes(pk, canonicalBytes(event, market, generation), event.signature);
  } catch {
    return false;
  }
}
