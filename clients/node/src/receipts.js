// Receipts: signed bytes, commitment and opening check (docs/protocol.md §11).
import { hmac } from '@noble/hashes/hmac';
import { sha256 } from '@noble/hashes/sha2';
import { Items, concat, utf8, u32be, toHex, fromHex, fromB64, checkInteger } from './bytes.js';
import { verifyBytes } from './signing.js';
import { keyId } from './keys.js';

const MEMBERS = {
  receipt_version: 'integer', purchase_id: 'string', buyer_id: 'string', stream_id: 'string',
  seller_id: 'string', mechanism: 'string', value_ids: 'array', level_before: 'number',
  level_after: 'number', price_minor: 'integer', currency: 'string', requested_at_ms: 'integer',
  market_key_id: 'string', commitment: 'string', ciphertext_digest: 'string', signature: 'string',
};

/** Raised when a receipt does not verify (`receipt_invalid`, §9). */
export class ReceiptInvalid extends Error {
  constructor(message) {
    super(message);
    this.reason = 'receipt_invalid';
  }
}

function checkShape(r) {
  if (!r || typeof r !== 'object' || Array.isArray(r)) throw new ReceiptInvalid('a receipt is a JSON object');
  for (const k of Object.keys(r)) if (!(k in MEMBERS)) throw new ReceiptInvalid(`unknown receipt member ${k}`);
  for (const [k, t] of Object.entries(MEMBERS)) {
    const v = r[k];
    if (k === 'ciphertext_digest' && v == null) continue;
    if (v === undefined) throw new ReceiptInvalid(`receipt member ${k} is missing`);
    const ok = t === 'array' ? Array.isArray(v) && v.every((x) => typeof x === 'string')
      : t === 'integer' ? Number.isSafeInteger(v)
        : t === 'number' ? typeof v === 'number' && Number.isFinite(v)
          : typeof v === 'string';
    if (!ok) throw new ReceiptInvalid(`receipt member ${k} is not ${t === 'array' ? 'a list of texts' : `a ${t}`}`);
  }
}

/** The bytes the market signs in a receipt of version 4 or 5 (§11.2). */
export function receiptBytes(r) {
  const it = new Items(concat(utf8('emarket-receipt'), Uint8Array.of(0)));
  it.i(r.receipt_version).s(r.purchase_id).s(r.buyer_id).s(r.stream_id).s(r.seller_id).s(r.mechanism);
  it.i(r.value_ids.length);
  for (const v of r.value_ids) it.s(v);
  it.f(r.level_before).f(r.level_after).i(r.price_minor).s(r.currency).i(r.requested_at_ms);
  it.s(r.market_key_id).s(r.commitment);
  const cd = r.ciphertext_digest ?? '';
  if (cd === '') it.n();
  else it.s(cd);
  return it.bytes();
}

function keyNumber(text) {
  if (typeof text !== 'string' || !/^(0|[1-9][0-9]*)$/.test(text)) throw new ReceiptInvalid(`histogram key ${JSON.stringify(text)} is not a key number`);
  const n = BigInt(text);
  if (n >= 1n << 64n) throw new ReceiptInvalid(`histogram key ${text} is not below 2^64`);
  return n;
}

/** `D`: SHA-256 over the releases in order (§11.3); version 5 adds the keys. */
export function releasesDigest(releases, version) {
  const h = sha256.create();
  for (const rel of releases) {
    const id = utf8(rel.value_id);
    const nums = rel.values;
    const b = Buffer.alloc(8 + 4 + 8 * nums.length + (version === 5 ? 8 * nums.length : 0));
    b.writeDoubleBE(Object.is(rel.level, -0) ? 0 : rel.level, 0);
    b.writeUInt32BE(nums.length, 8);
    nums.forEach((x, k) => b.writeDoubleLE(Object.is(x, -0) ? 0 : x, 12 + 8 * k));
    if (version === 5) {
      const keys = rel.keys ?? [];
      if (keys.length !== nums.length) throw new ReceiptInvalid(`release ${rel.value_id}: ${keys.length} keys for ${nums.length} numbers`);
      keys.forEach((k, j) => b.writeBigUInt64BE(keyNumber(k), 12 + 8 * nums.length + 8 * j));
    }
    h.update(concat(u32be(id.length), id, new Uint8Array(b)));
  }
  return h.digest();
}

/** The commitment: hex HMAC-SHA256(opening, "emarket receipt commitment v1" ‖ 00 ‖ D) (§11.3). */
export function commitment(opening, releases, version) {
  const msg = concat(utf8('emarket receipt commitment v1'), Uint8Array.of(0), releasesDigest(releases, version));
  return toHex(hmac(sha256, typeof opening === 'string' ? fromHex(opening) : opening, msg));
}

/**
 * Verify a receipt's signature under the trusted market key (base64): version, key id, bytes.
 * Throws ReceiptInvalid; returns the receipt.
 */
export function verifyReceipt(r, marketPublicKey) {
  checkShape(r);
  if (r.receipt_version !== 4 && r.receipt_version !== 5) throw new ReceiptInvalid(`receipt version ${r.receipt_version} is not 4 or 5`);
  if (r.market_key_id !== keyId(marketPublicKey)) throw new ReceiptInvalid(`receipt signed by key ${r.market_key_id}, not the market's ${keyId(marketPublicKey)}`);
  if (!/^[0-9a-f]{64}$/.test(r.commitment)) throw new ReceiptInvalid('commitment is not 64 hex digits');
  if (!verifyBytes(marketPublicKey, receiptBytes(r), r.signature)) throw new ReceiptInvalid('the receipt signature does not verify');
  return r;
}

/**
 * Verify an opened `purchase_fulfilled` (releases in clear, `opening` beside them): the
 * receipt's signature, that it describes this event, and that the releases open its commitment.
 * `sealedCiphertext` (base64) is the envelope's, when the purchase was delivered sealed.
 */
export function verifyOutcome(event, marketPublicKey, { sealedCiphertext } = {}) {
  const r = verifyReceipt(event.receipt, marketPublicKey);
  for (const k of ['purchase_id', 'buyer_id', 'stream_id', 'level_before', 'level_after', 'price_minor', 'currency']) {
    if (event[k] !== undefined && event[k] !== r[k]) throw new ReceiptInvalid(`${k} of the event (${event[k]}) is not the receipt's (${r[k]})`);
  }
  const releases = event.releases ?? [];
  const ids = releases.map((x) => x.value_id);
  if (ids.length !== r.value_ids.length || ids.some((v, j) => v !== r.value_ids[j])) throw new ReceiptInvalid('the releases are not the receipt\'s value_ids in order');
  for (const rel of releases) if (rel.level !== r.level_after) throw new ReceiptInvalid(`release ${rel.value_id} is not at level_after`);
  if (typeof event.opening !== 'string' || !/^[0-9a-f]{64}$/.test(event.opening)) throw new ReceiptInvalid('no opening beside the releases');
  if (commitment(event.opening, releases, r.receipt_version) !== r.commitment) throw new ReceiptInvalid('the releases do not open the receipt\'s commitment');
  const cd = r.ciphertext_digest ?? '';
  if (sealedCiphertext !== undefined) {
    if (cd !== toHex(sha256(fromB64(sealedCiphertext)))) throw new ReceiptInvalid('ciphertext_digest is not the envelope\'s');
  }
  checkInteger(r.price_minor);
  return r;
}
