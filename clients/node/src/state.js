// State records, format 2 (docs/protocol.md §3): for auditors holding the noise secret, who may
// open the market's changelog records and check its checkpoints' digest sums.
import { hmac } from '@noble/hashes/hmac';
import { sha256 } from '@noble/hashes/sha2';
import { blake2b } from '@noble/hashes/blake2b';
import { xchacha20poly1305 } from '@noble/ciphers/chacha';
import { concat, utf8, u32be } from './bytes.js';

const u64be = (n) => {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(n));
  return out;
};

/** [k_seal, k_digest] = HMAC-SHA256(noise_secret, label) (§3.2). */
export const stateKeys = (noiseSecret) => [
  hmac(sha256, noiseSecret, utf8('emarket state seal key v2')),
  hmac(sha256, noiseSecret, utf8('emarket state digest key v2')),
];

/** The 26-byte stamp of §3.1: u8(2) ‖ u32be(partition) ‖ u64be(epoch) ‖ u32be(n) ‖ u8(topic) ‖ u64be(offset). */
export const stateStamp = ({ partition, epoch, n, topic, offset }) => // epoch, offset: decimal strings
  concat(Uint8Array.of(2), u32be(partition), u64be(epoch), u32be(n), Uint8Array.of(topic), u64be(offset));

/** The associated data A of §3.1 (`deletion`: the record has no value). */
export function stateAad(store, key, stamp, deletion) {
  const s = utf8(store);
  if (s.length < 1 || s.length > 255) throw new Error('a store name is 1 to 255 bytes');
  return concat(utf8('emarket-state-v2'), Uint8Array.of(s.length), s, u32be(key.length), key, stamp,
    Uint8Array.of(deletion ? 0 : 1));
}

/** Open a record (its `emarket-state` header and value, null for a deletion): its plaintext
 * (null for a deletion) and stamp; throws if the market did not seal it. */
export function openState(kSeal, store, key, header, value) {
  const stamp = header.subarray(0, 26);
  if (stamp[0] !== 2) throw new Error(`stamp of format ${stamp[0]}`);
  const deletion = value == null;
  const sealed = deletion ? header.subarray(26) : value;
  if (header.length !== (deletion ? 66 : 26)) throw new Error('malformed record');
  const aad = stateAad(store, key, stamp, deletion);
  const plain = xchacha20poly1305(kSeal, sealed.subarray(0, 24), aad).decrypt(sealed.subarray(24));
  return { stamp, plaintext: deletion ? null : plain };
}

/** digest(S, K, e, n) of §3.4, as a BigInt. */
export function entryDigest(kDigest, store, key, epoch, n) {
  const s = utf8(store);
  const k = utf8(key);
  const data = concat(Uint8Array.of(s.length), s, u32be(k.length), k, u64be(epoch), u32be(n));
  const d = blake2b(data, { key: kDigest, dkLen: 32 });
  return BigInt(`0x${Buffer.from(d).toString('hex')}`);
}
