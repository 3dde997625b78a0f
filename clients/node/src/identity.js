// The identity encoding `enc(parts)` of docs/protocol.md §1.1 (used by the receipt opening, §11.4).
import { concat, u32be, utf8, fromHex } from './bytes.js';

const TAGS = { text: 's', bytes: 'b', integer: 'i', double: 'f' };

/** `enc(parts)`: each part `[type, value]` as `tag ‖ u32be(len data) ‖ data`. */
export function encodeIdentity(parts) {
  return concat(...parts.map(([type, value]) => {
    let data;
    if (type === 'text') data = utf8(value);
    else if (type === 'bytes') data = typeof value === 'string' ? fromHex(value) : value;
    else if (type === 'integer') data = utf8(BigInt(value).toString());
    else if (type === 'double') {
      const b = Buffer.alloc(8);
      b.writeDoubleBE(value);
      data = new Uint8Array(b);
    } else throw new Error(`unknown identity part ${type}`);
    return concat(utf8(TAGS[type]), u32be(data.length), data);
  }));
}
