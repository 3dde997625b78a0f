// Byte helpers and the tagged items of docs/protocol.md §2 (s, i, f, n, b, v).
import { sha256 } from '@noble/hashes/sha2';

const enc = new TextEncoder();

/** UTF-8 bytes of a text. */
export const utf8 = (text) => enc.encode(text);

/** Lower-case hex of bytes (§5). */
export const toHex = (bytes) => Buffer.from(bytes).toString('hex');

/** Bytes of lower-case or upper-case hex. */
export function fromHex(hex) {
  if (typeof hex !== 'string' || !/^([0-9a-fA-F]{2})*$/.test(hex)) throw new Error(`not hex: ${hex}`);
  return new Uint8Array(Buffer.from(hex, 'hex'));
}

/** Standard base64 with padding (RFC 4648 §4), as every field of §5 is written. */
export const toB64 = (bytes) => Buffer.from(bytes).toString('base64');

/** Bytes of canonical standard base64; anything else (unpadded, URL-safe, spaces) is refused. */
export function fromB64(text) {
  if (typeof text !== 'string' || !/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(text)) {
    throw new Error(`not canonical base64: ${JSON.stringify(text)}`);
  }
  const out = new Uint8Array(Buffer.from(text, 'base64'));
  if (toB64(out) !== text) throw new Error(`not canonical base64: ${JSON.stringify(text)}`);
  return out;
}

/** SHA-256 of bytes or of a text's UTF-8. */
export const sha256Of = (data) => sha256(typeof data === 'string' ? utf8(data) : data);

/** Concatenation of byte arrays. */
export function concat(...parts) {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export function u32be(n) {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return new Uint8Array(b);
}

export function u64be(n) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return new Uint8Array(b);
}

/** `sized(x) = u32be(len x) ‖ x` (§4.1). */
export const sized = (bytes) => concat(u32be(bytes.length), bytes);

/** An integer every reader reads alike: whole, magnitude at most 2^53 − 1 (§2.2). */
export function checkInteger(x, what = 'integer') {
  if (typeof x === 'bigint') x = Number(x);
  if (!Number.isSafeInteger(x)) throw new Error(`${what} must be a whole number of magnitude at most 2^53 - 1, got ${x}`);
  return x;
}

/** −0.0 is signed as +0.0 (§2.5). */
const unzero = (x) => (Object.is(x, -0) ? 0 : x);

function checkDouble(x, what) {
  if (typeof x !== 'number' || !Number.isFinite(x)) throw new Error(`${what} must be a finite number, got ${x}`);
  return unzero(x);
}

/**
 * A writer of the tagged items of §2: one signed byte string, item by item.
 */
export class Items {
  constructor(head) {
    this.parts = head ? [head] : [];
  }

  raw(bytes) {
    this.parts.push(bytes);
    return this;
  }

  /** `s(x)`: 73 ‖ u32be(len UTF-8) ‖ UTF-8, the text exactly as sent. */
  s(text) {
    if (typeof text !== 'string') throw new Error(`expected text, got ${JSON.stringify(text)}`);
    if (!text.isWellFormed()) throw new Error('text holds a lone surrogate');
    const b = utf8(text);
    return this.raw(concat(Uint8Array.of(0x73), u32be(b.length), b));
  }

  /** `i(x)`: 69 ‖ i64be. */
  i(x, what) {
    const v = checkInteger(x, what);
    const b = Buffer.alloc(9);
    b[0] = 0x69;
    b.writeBigInt64BE(BigInt(v), 1);
    return this.raw(new Uint8Array(b));
  }

  /** `f(x)`: 66 ‖ binary64 big-endian, −0 as +0. */
  f(x, what = 'number') {
    const b = Buffer.alloc(9);
    b[0] = 0x66;
    b.writeDoubleBE(checkDouble(x, what), 1);
    return this.raw(new Uint8Array(b));
  }

  /** `n`: a null field. */
  n() {
    return this.raw(Uint8Array.of(0x6e));
  }

  /** `b(x)`: 62 ‖ 01 or 00. */
  b(x) {
    if (typeof x !== 'boolean') throw new Error(`expected a boolean, got ${x}`);
    return this.raw(Uint8Array.of(0x62, x ? 1 : 0));
  }

  /** `v(x1…xk)`: 76 ‖ u32be(k) ‖ each double little-endian, −0 as +0. */
  v(xs, what = 'values') {
    const b = Buffer.alloc(5 + 8 * xs.length);
    b[0] = 0x76;
    b.writeUInt32BE(xs.length, 1);
    xs.forEach((x, k) => b.writeDoubleLE(checkDouble(x, what), 5 + 8 * k));
    return this.raw(new Uint8Array(b));
  }

  /** `s(x)` or `n` when x is null or absent. */
  sOrN(x) {
    return x === undefined || x === null ? this.n() : this.s(x);
  }

  /** `f(x)` or `n` when x is null or absent. */
  fOrN(x, what) {
    return x === undefined || x === null ? this.n() : this.f(x, what);
  }

  /** `i(x)` or `n` when x is null or absent. */
  iOrN(x, what) {
    return x === undefined || x === null ? this.n() : this.i(x, what);
  }

  bytes() {
    return concat(...this.parts);
  }
}
