// State record authenticators (docs/protocol.md §3): for auditors holding the noise secret.
import { hmac } from '@noble/hashes/hmac';
import { sha256 } from '@noble/hashes/sha2';
import { concat, utf8, u32be } from './bytes.js';

/** k_state = HMAC-SHA256(noise_secret, "emarket state-mac key v1") (§3.2). */
export const stateKey = (noiseSecret) => hmac(sha256, noiseSecret, utf8('emarket state-mac key v1'));

/** `M` of §3.1; `value` null for a deletion. */
export function stateCovered(store, key, value) {
  const s = utf8(store);
  if (s.length < 1 || s.length > 255) throw new Error('a store name is 1 to 255 bytes');
  const head = concat(utf8('emarket-state-v1'), Uint8Array.of(s.length), s, u32be(key.length), key);
  return value == null ? concat(head, Uint8Array.of(0)) : concat(head, Uint8Array.of(1), u32be(value.length), value);
}

/** The `emarket-state` header value: u8(1) ‖ HMAC-SHA256(k_state, M). */
export const stateHeader = (kState, store, key, value) => concat(Uint8Array.of(1), hmac(sha256, kState, stateCovered(store, key, value)));
