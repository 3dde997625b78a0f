// Proof of work for an opening in an open market (docs/protocol.md §6.1.2).
import { createHash } from 'node:crypto';
import { Items, utf8 } from './bytes.js';

export const WORK_DOMAIN = utf8('emarket-work-v1\0');
/** An open market's default work per opening, in bits; a client goes up to MAX_WORK_BITS. */
export const DEFAULT_WORK_BITS = 20;
export const MAX_WORK_BITS = DEFAULT_WORK_BITS + 4;

/** The bytes hashed for `work`: domain ‖ s(prefix) ‖ s(account_id) ‖ s(signing_key) ‖ s(work). */
export const workBytes = (prefix, accountId, signingKey, work) =>
  new Items(WORK_DOMAIN).s(prefix).s(accountId).s(signingKey).s(work).bytes();

/** How many zero bits `digest` begins with. */
export function leadingZeroBits(digest) {
  let n = 0;
  for (const byte of digest) {
    if (byte === 0) { n += 8; continue; }
    return n + Math.clz32(byte) - 24;
  }
  return n;
}

/** A `work` text whose hash begins with `bits` zero bits (2^bits hashes on average). */
export function solveWork(prefix, accountId, signingKey, bits) {
  const head = new Items(WORK_DOMAIN).s(prefix).s(accountId).s(signingKey).bytes();
  for (let n = 0; ; n += 1) {
    const text = String(n);
    const digest = createHash('sha256').update(head).update(new Items().s(text).bytes()).digest();
    if (leadingZeroBits(digest) >= bits) return text;
  }
}
