// Keys, key ids and key files (docs/protocol.md §5, §5.2).
import { readFileSync, writeFileSync, existsSync, statSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { ed25519, x25519 } from '@noble/curves/ed25519';
import { sha256Of, toHex, fromHex, toB64, fromB64 } from './bytes.js';

const KEY_RE = /^[A-Za-z0-9+/]{43}=$/;

/** Key id: the first 16 hex digits of SHA-256 of the 32 raw public key bytes (§5). */
export function keyId(publicKey) {
  const raw = typeof publicKey === 'string' ? decodePublicKey(publicKey) : publicKey;
  return toHex(sha256Of(raw)).slice(0, 16);
}

/** The 32 raw bytes of a base64 public key (§5: 44 characters, the last `=`). */
export function decodePublicKey(text) {
  if (!KEY_RE.test(text)) throw new Error(`not a base64 public key: ${JSON.stringify(text)}`);
  return fromB64(text);
}

/** The key-file format this client writes (§5.2); format 1 and this client's first files are read. */
export const KEY_FILE_VERSION = 2;
const B64_32 = /^[A-Za-z0-9+/]{43}=$/;
const HEX_32 = /^[0-9a-f]{64}$/;

class KeyFileError extends Error {}

function privateKey(doc, name, hexed = false) {
  const raw = doc[name];
  if (raw === undefined || raw === null) return null;
  if (typeof raw !== 'string' || !(hexed ? HEX_32 : B64_32).test(raw)) {
    throw new KeyFileError(`\`${name}\` must be ${hexed ? '64 lower-case hex digits' : 'base64 of 32 bytes (44 characters)'}`);
  }
  return hexed ? fromHex(raw) : fromB64(raw);
}

function version(doc, name = 'key_version') {
  const v = doc[name] ?? 1;
  if (!Number.isInteger(v) || v < 1 || v >= 2 ** 31) throw new KeyFileError(`\`${name}\` must be an integer from 1`);
  return v;
}

function checked(doc, name, derived) {
  if (doc[name] !== undefined && doc[name] !== null && doc[name] !== derived) {
    throw new KeyFileError(`\`${name}\` is not the public key of its private key`);
  }
}

/**
 * A party: account id, Ed25519 seed, optional X25519 private key, key version, and the sealing
 * keys of earlier key versions (`previous`, oldest first: what was sealed to them still opens).
 * Its public keys are derived, never trusted apart from the secrets.
 */
export class Party {
  constructor({ accountId, signingSeed, sealingPrivate = null, keyVersion = 1, previous = [] }) {
    this.accountId = accountId;
    this.signingSeed = signingSeed;
    this.sealingPrivate = sealingPrivate;
    this.keyVersion = keyVersion;
    this.previous = previous.map((k) => ({ keyVersion: k.keyVersion, sealingPrivate: k.sealingPrivate, sealingKey: toB64(x25519.getPublicKey(k.sealingPrivate)) }));
    this.signingKey = toB64(ed25519.getPublicKey(signingSeed));
    this.sealingKey = sealingPrivate ? toB64(x25519.getPublicKey(sealingPrivate)) : null;
    this.keyId = keyId(this.signingKey);
  }

  /** A new party with fresh keys from the system's secure generator. */
  static generate(accountId, { sealing = true } = {}) {
    return new Party({
      accountId,
      signingSeed: new Uint8Array(randomBytes(32)),
      sealingPrivate: sealing ? new Uint8Array(randomBytes(32)) : null,
    });
  }

  /** Every sealing key held, the current one first, then the newest retired: `{keyVersion, sealingPrivate, sealingKey}`. */
  sealingKeys() {
    const now = this.sealingPrivate ? [{ keyVersion: this.keyVersion, sealingPrivate: this.sealingPrivate, sealingKey: this.sealingKey }] : [];
    return [...now, ...[...this.previous].reverse()];
  }

  /** `previous` once these keys, at `version`, are rotated away from (what the new key file records). */
  retiring(version) {
    const byVersion = new Map(this.previous.map((k) => [k.keyVersion, k]));
    if (this.sealingPrivate) byVersion.set(version, { keyVersion: version, sealingPrivate: this.sealingPrivate, sealingKey: this.sealingKey });
    const byKey = new Map();
    for (const v of [...byVersion.keys()].sort((a, b) => a - b)) byKey.set(byVersion.get(v).sealingKey, byVersion.get(v));
    return [...byKey.values()].sort((a, b) => a.keyVersion - b.keyVersion);
  }

  /** This party also holding every sealing key of `others` (older key files of the account). */
  holding(others) {
    const got = [...this.previous];
    for (const o of others) {
      if (o.accountId !== this.accountId) throw new KeyFileError(`a key file of account ${o.accountId} cannot open ${this.accountId}'s releases`);
      got.push(...o.sealingKeys());
    }
    const byKey = new Map(got.filter((k) => k.sealingKey !== this.sealingKey).map((k) => [k.sealingKey, k]));
    return new Party({ ...this, previous: [...byKey.values()].sort((a, b) => a.keyVersion - b.keyVersion) });
  }

  /** The key file's JSON (§5.2): members in this order, written two-space indented. */
  toJSON() {
    const b64 = (k) => (k ? toB64(k) : null);
    return {
      version: KEY_FILE_VERSION,
      account_id: this.accountId,
      key_version: this.keyVersion,
      signing_private_key: toB64(this.signingSeed),
      signing_key: this.signingKey,
      sealing_private_key: b64(this.sealingPrivate),
      sealing_key: this.sealingKey,
      previous: this.previous.map((k) => ({ key_version: k.keyVersion, sealing_private_key: toB64(k.sealingPrivate), sealing_key: k.sealingKey })),
    };
  }

  /** The key file's text, byte for byte what the Python client writes for the same keys. */
  keyFile() {
    return JSON.stringify(this.toJSON(), null, 2) + '\n';
  }

  /** A party from a key file's JSON: format 2 (§5.2), format 1, or this client's first files. */
  static fromJSON(doc) {
    if (!doc || typeof doc !== 'object' || Array.isArray(doc)) throw new KeyFileError('not a JSON object');
    let names;
    let hexed = false;
    if (doc.version === KEY_FILE_VERSION) names = ['signing_private_key', 'sealing_private_key'];
    else if (doc.version === 1) names = ['signing_key', 'sealing_key'];
    else if (doc.version === undefined && 'signing_private_key' in doc) [names, hexed] = [['signing_private_key', 'sealing_private_key'], true];
    else throw new KeyFileError(`format version ${JSON.stringify(doc.version)}; this client reads 1 and 2`);
    if (typeof doc.account_id !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(doc.account_id)) {
      throw new KeyFileError("`account_id` must be 1-64 of letters, digits, '_' and '-'");
    }
    const seed = privateKey(doc, names[0], hexed);
    if (!seed) throw new KeyFileError(`no \`${names[0]}\``);
    const keyVersion = version(doc);
    const items = doc.previous ?? [];
    if (!Array.isArray(items)) throw new KeyFileError('`previous` must be a list');
    const previous = items.map((item) => {
      if (!item || typeof item !== 'object' || Array.isArray(item)) throw new KeyFileError('each of `previous` must be an object');
      const priv = privateKey(item, 'sealing_private_key');
      if (!priv) throw new KeyFileError('an entry of `previous` has no `sealing_private_key`');
      return { keyVersion: version(item), sealingPrivate: priv };
    });
    const versions = previous.map((k) => k.keyVersion);
    if (versions.some((v, j) => j > 0 && v <= versions[j - 1]) || (versions.length && versions[versions.length - 1] >= keyVersion)) {
      throw new KeyFileError('`previous` must list distinct versions below `key_version`, oldest first');
    }
    const p = new Party({ accountId: doc.account_id, signingSeed: seed, sealingPrivate: privateKey(doc, names[1], hexed), keyVersion, previous });
    if (doc.version !== 1) {
      checked(doc, 'signing_key', p.signingKey);
      checked(doc, 'sealing_key', p.sealingKey);
      items.forEach((item, j) => checked(item, 'sealing_key', p.previous[j].sealingKey));
    }
    return p;
  }

  /** Write a new key file (mode 0600); never overwrites one. */
  save(path) {
    if (existsSync(path)) throw new Error(`${path} exists: a key file is never overwritten`);
    writeFileSync(path, this.keyFile(), { mode: 0o600, flag: 'wx' });
  }

  /**
   * Read a key file; `warn` (default: stderr) is told if others may read or change it
   * (`exposure`): it is read all the same, with the `chmod` that fixes it.
   */
  static load(path, { warn = (m) => console.error(m) } = {}) {
    const text = readFileSync(path, 'utf8');
    const said = exposure(path);
    if (said) warn(said);
    let doc;
    try {
      doc = JSON.parse(text);
    } catch {
      throw new KeyFileError('not an epsilon-market key file (not JSON; docs/protocol.md §5.2)');
    }
    try {
      return Party.fromJSON(doc);
    } catch (err) {
      if (err instanceof KeyFileError) throw new KeyFileError(`not an epsilon-market key file (${err.message}; docs/protocol.md §5.2)`);
      throw err;
    }
  }
}

/**
 * The warning for a key file users other than its owner may read or change (a group or other
 * permission bit set), naming the fix; null if it is private (or the system has no such bits).
 */
export function exposure(path) {
  if (process.platform === 'win32') return null;
  let mode;
  try {
    mode = statSync(path).mode & 0o777;
  } catch {
    return null;
  }
  if (!(mode & 0o077)) return null;
  return `warning: the key file ${path} can be read or changed by other users (mode ${mode.toString(8).padStart(4, '0')}): its private keys may be exposed; make it yours alone with \`chmod 600 ${path}\` (and rotate the keys if others may have read it)`;
}

export { KeyFileError };
