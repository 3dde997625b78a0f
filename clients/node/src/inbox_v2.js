// v2 inboxes (docs/protocol.md §8.5): one partitioned topic `<p>.inbox`, each record keyed by a
// route only the market and the account can compute, sealed to the account and signed by the
// market over bytes that name the account. This module is the bytes alone: routes, opening and
// checking a record, and making one (what the market does: for the vectors and the tests).
import { x25519, ed25519 } from '@noble/curves/ed25519';
import { hkdf } from '@noble/hashes/hkdf';
import { hmac } from '@noble/hashes/hmac';
import { sha256 } from '@noble/hashes/sha2';
import { chacha20poly1305 } from '@noble/ciphers/chacha';
import { Items, concat, utf8, u32be, toHex, fromB64 } from './bytes.js';
import { decodePublicKey } from './keys.js';
import { partitionOf } from './partition.js';

/** The first byte of a record's value: the format of §8.5.4. */
export const RECORD_FORMAT = 0x02;
/** `"emarket-inbox-v2" ‖ 00`: the head of the v2 signed bytes `B`. */
export const INBOX_V2_HEAD = concat(utf8('emarket-inbox-v2'), Uint8Array.of(0));
const ROUTE_LABEL = utf8('emarket inbox route v2');
const SEAL_LABEL = utf8('emarket inbox seal v2');
const NONCE = 12;
const TAG = 16;
const SIGNATURE = 64;
const R_HEX = /^[0-9a-f]{64}$/;

/** A record that was not written by the market to this account; `why` says which check failed. */
export class InboxRecordError extends Error {}

const raw32 = (key) => (typeof key === 'string' ? decodePublicKey(key) : key);

/**
 * The route and seal key of one account under one of its sealing keys (§8.5.3), with the
 * intermediate values the vectors list. `sealingPrivate` is the account's X25519 private key,
 * `marketSealingKey` the market's public one (base64 or 32 bytes); `partitions` (the identity's
 * `inbox_partitions`) gives the route's partition of `<p>.inbox`.
 */
export function inboxRoute({ prefix, accountId, sealingPrivate, marketSealingKey, partitions }) {
  const market = raw32(marketSealingKey);
  const mine = x25519.getPublicKey(sealingPrivate);
  const shared = x25519.getSharedSecret(sealingPrivate, market);
  if (shared.every((b) => b === 0)) throw new InboxRecordError('the X25519 shared secret with the market\'s sealing key is zero: not a usable key');
  return routeFrom({ prefix, accountId, shared, salt: concat(market, mine), partitions });
}

/** The same, from the shared secret: the market's side (it holds `m`, not `a`). */
export function routeFrom({ prefix, accountId, shared, salt, partitions }) {
  const who = new Items(Uint8Array.of(0)).s(prefix).s(accountId).bytes();
  const routeInfo = concat(ROUTE_LABEL, who);
  const sealInfo = concat(SEAL_LABEL, who);
  const route = toHex(hkdf(sha256, shared, salt, routeInfo, 16));
  const sealKey = hkdf(sha256, shared, salt, sealInfo, 32);
  const partition = partitions ? partitionOf(route, partitions) : undefined;
  return { shared, salt, routeInfo, sealInfo, route, sealKey, partition };
}

/**
 * `B` of §8.5.4 for `messages` `[{request, key, value}]` (request: hex R, or null for a message
 * that answers no single event; key and value text or bytes).
 */
export function inboxSignedBytes({ prefix, accountId, messages }) {
  const it = new Items(INBOX_V2_HEAD).s(prefix).s(accountId).i(messages.length, 'count');
  for (const m of messages) {
    it.sOrN(m.request);
    it.raw(sBytes(m.key)).raw(sBytes(m.value));
  }
  return it.bytes();
}

/** `s(x)` of text or of bytes (a message's value is the JSON bytes as written). */
function sBytes(x) {
  const b = typeof x === 'string' ? utf8(x) : x;
  return concat(Uint8Array.of(0x73), u32be(b.length), b);
}

/** The padded length of a plaintext of `n` bytes: a power of two ≥ 256 up to 64 KiB, then 64 KiB steps. */
export function paddedLength(n) {
  if (n > 65536) return Math.ceil(n / 65536) * 65536;
  let p = 256;
  while (p < n) p *= 2;
  return p;
}

/**
 * A record as the market writes it (§8.5.4): `{key, value, signedBytes, signature, plaintext,
 * nonce}`. `marketSeed` is the market's Ed25519 private key; `sealKey` and `route` the account's.
 */
export function sealInboxRecord({ prefix, accountId, messages, marketSeed, route, sealKey }) {
  const signedBytes = inboxSignedBytes({ prefix, accountId, messages });
  const signature = ed25519.sign(signedBytes, marketSeed);
  const body = concat(signature, signedBytes);
  const plaintext = new Uint8Array(paddedLength(body.length));
  plaintext.set(body);
  const nonce = hmac(sha256, sealKey, plaintext).subarray(0, NONCE);
  const ct = chacha20poly1305(sealKey, nonce, utf8(route)).encrypt(plaintext);
  return { key: route, value: concat(Uint8Array.of(RECORD_FORMAT), nonce, ct), signedBytes, signature, plaintext, unpadded: body.length, nonce };
}

/** A reader of §2's tagged items over `B`, refusing anything else. */
class ItemReader {
  constructor(bytes, at) {
    this.b = bytes;
    this.at = at;
  }

  tag() {
    if (this.at >= this.b.length) throw new InboxRecordError('the signed bytes end early');
    return this.b[this.at];
  }

  take(n) {
    if (this.at + n > this.b.length) throw new InboxRecordError('the signed bytes end early');
    const out = this.b.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }

  /** `s(x)`: its bytes. */
  s(what) {
    if (this.tag() !== 0x73) throw new InboxRecordError(`${what}: not a text item`);
    this.at += 1;
    const n = new DataView(this.b.buffer, this.b.byteOffset + this.at).getUint32(0);
    this.at += 4;
    return this.take(n);
  }

  text(what) {
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(this.s(what));
    } catch (err) {
      if (err instanceof InboxRecordError) throw err;
      throw new InboxRecordError(`${what}: not UTF-8`);
    }
  }

  /** `i(x)`, as a Number (a count: small). */
  i(what) {
    if (this.tag() !== 0x69) throw new InboxRecordError(`${what}: not an integer item`);
    this.at += 1;
    const v = new DataView(this.b.buffer, this.b.byteOffset + this.at).getBigInt64(0);
    this.at += 8;
    return v;
  }

  /** `s(x)` as text, or null for `n`. */
  textOrNull(what) {
    if (this.tag() === 0x6e) {
      this.at += 1;
      return null;
    }
    return this.text(what);
  }
}

/**
 * Parse `B` at the start of `bytes` (the plaintext after the signature): `{prefix, accountId,
 * messages, length}`, every message `{request, key, value}` (value: bytes, as the market wrote
 * the JSON). What follows `B` must be zero bytes.
 */
export function parseSignedBytes(bytes) {
  const head = bytes.subarray(0, INBOX_V2_HEAD.length);
  if (head.length !== INBOX_V2_HEAD.length || !head.every((x, j) => x === INBOX_V2_HEAD[j])) {
    throw new InboxRecordError('its signed bytes do not begin with the v2 head');
  }
  const r = new ItemReader(bytes, INBOX_V2_HEAD.length);
  const prefix = r.text('market prefix');
  const accountId = r.text('account id');
  const count = r.i('count');
  if (count < 1n || count > BigInt(bytes.length)) throw new InboxRecordError(`a count of ${count} messages`);
  const messages = [];
  for (let k = 0; k < Number(count); k++) {
    const request = r.textOrNull('R');
    if (request !== null && !R_HEX.test(request)) throw new InboxRecordError('an R that is not 64 lower-case hex digits');
    const key = r.text('message key');
    const value = r.s('message value');
    messages.push({ request, key, value: new Uint8Array(value) });
  }
  const length = r.at;
  if (!bytes.subarray(length).every((x) => x === 0)) throw new InboxRecordError('its padding is not zero bytes');
  return { prefix, accountId, messages, length };
}

/**
 * Open a record of `<p>.inbox` read under this account's `route` (§8.5.5 step 5): decrypt with
 * the route's seal key and the record key as AAD, verify the market's signature over `B`, check
 * `B` names this market and account. Returns the messages `[{request, key, value}]`; throws
 * InboxRecordError (why) for a record the market did not write to this account.
 */
export function openInboxRecord({ key, value, route, sealKey, prefix, accountId, marketPublicKey }) {
  const k = typeof key === 'string' ? key : new TextDecoder().decode(key ?? new Uint8Array());
  if (k !== route) throw new InboxRecordError('its key is not this account\'s route');
  const v = value ? new Uint8Array(value) : new Uint8Array();
  if (v.length < 1 + NONCE + TAG) throw new InboxRecordError(`a ${v.length}-byte value is too short to be a sealed record`);
  if (v[0] !== RECORD_FORMAT) throw new InboxRecordError(`its value begins with ${v[0]}, not 2`);
  let plaintext;
  try {
    plaintext = chacha20poly1305(sealKey, v.subarray(1, 1 + NONCE), utf8(k)).decrypt(v.subarray(1 + NONCE));
  } catch {
    throw new InboxRecordError('it does not open with this account\'s seal key');
  }
  if (plaintext.length < SIGNATURE) throw new InboxRecordError('its plaintext is shorter than a signature');
  const signature = plaintext.subarray(0, SIGNATURE);
  const parsed = parseSignedBytes(plaintext.subarray(SIGNATURE));
  const signed = plaintext.subarray(SIGNATURE, SIGNATURE + parsed.length);
  const pk = typeof marketPublicKey === 'string' ? fromB64(marketPublicKey) : marketPublicKey;
  let good = false;
  try {
    good = ed25519.verify(signature, signed, pk, { zip215: false });
  } catch {
    good = false;
  }
  if (!good) throw new InboxRecordError('the signature does not verify under the market key');
  if (parsed.prefix !== prefix) throw new InboxRecordError(`it names market ${JSON.stringify(parsed.prefix)}, not ${JSON.stringify(prefix)}`);
  if (parsed.accountId !== accountId) throw new InboxRecordError('it names another account');
  return parsed.messages;
}
