// Partitions (docs/protocol.md §8.2): Kafka's murmur2 on the UTF-8 of the id.
import { utf8 } from './bytes.js';

/** Kafka's murmur2 of bytes, as an unsigned 32-bit integer. */
export function murmur2(data) {
  const m = 0x5bd1e995;
  const n = data.length;
  let h = (0x9747b28c ^ n) >>> 0;
  const whole = n - (n % 4);
  for (let i = 0; i < whole; i += 4) {
    let k = (data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)) >>> 0;
    k = Math.imul(k, m) >>> 0;
    k = (k ^ (k >>> 24)) >>> 0;
    k = Math.imul(k, m) >>> 0;
    h = (Math.imul(h, m) ^ k) >>> 0;
  }
  const rest = n % 4;
  if (rest) {
    let t = 0;
    for (let j = rest - 1; j >= 0; j--) t = (t << 8) | data[whole + j];
    h = Math.imul((h ^ t) >>> 0, m) >>> 0;
  }
  h = (h ^ (h >>> 13)) >>> 0;
  h = Math.imul(h, m) >>> 0;
  h = (h ^ (h >>> 15)) >>> 0;
  return h;
}

/** The partition of an id among `count` partitions: (murmur2 & 0x7fffffff) mod count. */
export const partitionOf = (id, count) => (murmur2(utf8(id)) & 0x7fffffff) % count;
