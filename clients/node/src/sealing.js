// Sealing values to the market and opening releases sealed to a buyer (docs/protocol.md §4).
import { randomBytes } from 'node:crypto';
import { x25519 } from '@noble/curves/ed25519';
import { hkdf } from '@noble/hashes/hkdf';
import { sha256 } from '@noble/hashes/sha2';
import { chacha20poly1305 } from '@noble/ciphers/chacha';
import { concat, sized, u32be, u64be, utf8, toB64, fromB64, checkInteger } from './bytes.js';
import { decodePublicKey } from './keys.js';

export const ALG = 'x25519-hkdf-sha256-chacha20poly1305';
const INFO = utf8('epsilon-market release v1');

/** The AAD of a sealed batch (§4.1). */
export function valuesAad({ prefix, marketSealingKey, streamId, sellerId, items }) {
  const k = typeof marketSealingKey === 'string' ? decodePublicKey(marketSealingKey) : marketSealingKey;
  const parts = [
    utf8('emarket values v1'), Uint8Array.of(0), sized(utf8(prefix)), sized(k),
    sized(utf8(streamId)), sized(utf8(sellerId)), u32be(items.length),
  ];
  for (const it of items) parts.push(sized(utf8(it.value_id)), u64be(checkInteger(it.published_at_ms, 'published_at_ms')));
  return concat(...parts);
}

/** The HKDF key of the envelope: ikm = shared, salt = epk ‖ recipient key (§4.3). */
export function envelopeKey(shared, epk, recipient) {
  if (shared.every((b) => b === 0)) throw new Error('X25519 shared secret is zero: not a usable key');
  return hkdf(sha256, shared, concat(epk, recipient), INFO, 32);
}

/**
 * Seal `plaintext` (bytes) for the X25519 public key `recipient` (32 bytes) under `aad`.
 * `ephemeral` and `nonce` are drawn fresh unless given (test vectors only).
 */
export function seal(plaintext, recipient, aad, { ephemeral, nonce } = {}) {
  const e = ephemeral ?? new Uint8Array(randomBytes(32));
  const n = nonce ?? new Uint8Array(randomBytes(12));
  const epk = x25519.getPublicKey(e);
  const key = envelopeKey(x25519.getSharedSecret(e, recipient), epk, recipient);
  const ct = chacha20poly1305(key, n, aad).encrypt(plaintext);
  return { alg: ALG, epk: toB64(epk), nonce: toB64(n), ciphertext: toB64(ct) };
}

/** Open an envelope sealed to the X25519 private key `priv` under `aad`; returns bytes. */
export function open(envelope, priv, aad) {
  if (envelope.alg !== ALG) throw new Error(`unknown envelope alg ${envelope.alg}`);
  const epk = fromB64(envelope.epk);
  const nonce = fromB64(envelope.nonce);
  if (epk.length !== 32 || nonce.length !== 12) throw new Error('envelope: bad epk or nonce length');
  const mine = x25519.getPublicKey(priv);
  const key = envelopeKey(x25519.getSharedSecret(priv, epk), epk, mine);
  return chacha20poly1305(key, nonce, aad).decrypt(fromB64(envelope.ciphertext));
}

/**
 * The plaintext of a sealed batch (§4.2): `[{"values": [...], "keys"?: [...]}, …]`, then
 * spaces: each number counts 24 characters (`25·n + 1 − len(J)` per item), and a batch with
 * histogram keys is rounded up to a power of two, at least 1,024 bytes.
 */
export function valuesPlaintext(items) {
  const json = JSON.stringify(items.map((it) => (it.keys != null ? { values: it.values ?? [], keys: it.keys } : { values: it.values ?? [] })));
  let size = utf8(json).length;
  for (const it of items) {
    const n = (it.values ?? []).length;
    if (n) size += 25 * n + 1 - JSON.stringify(it.values).length;
  }
  if (items.some((it) => it.keys != null)) {
    let p = 1;
    while (p < size) p *= 2;
    size = Math.max(1024, p);
  }
  return utf8(json + ' '.repeat(size - utf8(json).length));
}

/**
 * A `values` event (unsigned) with the numbers of `items` sealed to the market (§4.5):
 * items keep `value_id` and `published_at_ms` only.
 */
export function sealBatch({ prefix, marketSealingKey, streamId, sellerId, items, ephemeral, nonce }) {
  const k = decodePublicKey(marketSealingKey);
  const aad = valuesAad({ prefix, marketSealingKey: k, streamId, sellerId, items });
  const sealed = seal(valuesPlaintext(items), k, aad, { ephemeral, nonce });
  return {
    type: 'values',
    stream_id: streamId,
    seller_id: sellerId,
    items: items.map((it) => ({ value_id: it.value_id, published_at_ms: it.published_at_ms })),
    sealed,
  };
}

/** The AAD of a release sealed to a buyer (§4.6). */
export function releaseAad(event) {
  if (event.type === 'purchase_fulfilled') return utf8(event.purchase_id);
  if (event.type === 'value_released') return utf8(`${event.stream_id}/${event.buyer_id}`);
  throw new Error(`no sealed releases in a ${event.type}`);
}

/**
 * Open the releases of a `purchase_fulfilled` or `value_released` with the buyer's X25519
 * private key: returns a copy with `releases` (and `opening`) filled in from the envelope, which
 * it keeps (its ciphertext is what a receipt's `ciphertext_digest` names), as `buy --output`
 * files are written (§11.4).
 */
export function openReleases(event, priv) {
  if (event.sealed == null || event.opening || event.releases?.length) return { ...event };
  const text = new TextDecoder('utf-8', { fatal: true }).decode(open(event.sealed, priv, releaseAad(event)));
  const doc = JSON.parse(text);
  if (event.type === 'purchase_fulfilled') {
    if (!doc || typeof doc !== 'object' || Array.isArray(doc)) throw new Error('sealed purchase: not an object');
    return { ...event, releases: doc.releases, opening: doc.opening };
  }
  if (!Array.isArray(doc)) throw new Error('sealed delivery: not an array');
  return { ...event, releases: doc };
}
