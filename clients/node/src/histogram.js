// Histogram keys (docs/protocol.md §7).
import { sha256 } from '@noble/hashes/sha2';
import { concat, utf8 } from './bytes.js';

export const STRING_KEY_LABEL = concat(utf8('emarket-histogram-key-v1'), Uint8Array.of(0));

/** The public 62-bit number of a string key, as decimal text: ⌊u64be(SHA-256(label ‖ NFC))/4⌋. */
export function stringKey(text) {
  const d = sha256(concat(STRING_KEY_LABEL, utf8(text.normalize('NFC'))));
  return (Buffer.from(d).readBigUInt64BE(0) >> 2n).toString();
}

/** Map released key numbers back to names: `{number: name}` for every name known. */
export function nameKeys(names) {
  const out = new Map();
  for (const n of names) out.set(stringKey(n), n);
  return out;
}
