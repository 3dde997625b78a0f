// Keys, key ids and key files (docs/protocol.md §5).
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
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

/**
 * A party: account id, Ed25519 seed, optional X25519 private key, key version.
 * Its public keys are derived, never stored apart from the secrets.
 */
export class Party {
  constructor({ accountId, signingSeed, sealingPrivate = null, keyVersion = 1 }) {
    this.accountId = accountId;
    this.signingSeed = signingSeed;
    this.sealingPrivate = sealingPrivate;
    this.keyVersion = keyVersion;
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

  toJSON() {
    const out = {
      account_id: this.accountId,
      signing_private_key: toHex(this.signingSeed),
      signing_key: this.signingKey,
      key_id: this.keyId,
    };
    if (this.sealingPrivate) {
      out.sealing_private_key = toHex(this.sealingPrivate);
      out.sealing_key = this.sealingKey;
    }
    if (this.keyVersion !== 1) out.key_version = this.keyVersion;
    return out;
  }

  static fromJSON(doc) {
    const p = new Party({
      accountId: doc.account_id,
      signingSeed: fromHex(doc.signing_private_key),
      sealingPrivate: doc.sealing_private_key ? fromHex(doc.sealing_private_key) : null,
      keyVersion: doc.key_version ?? 1,
    });
    if (doc.signing_key && doc.signing_key !== p.signingKey) throw new Error('key file: signing_key does not match its private key');
    return p;
  }

  /** Write a new key file (mode 0600); never overwrites one. */
  save(path) {
    if (existsSync(path)) throw new Error(`${path} exists: a key file is never overwritten`);
    writeFileSync(path, JSON.stringify(this.toJSON(), null, 2) + '\n', { mode: 0o600, flag: 'wx' });
  }

  static load(path) {
    return Party.fromJSON(JSON.parse(readFileSync(path, 'utf8')));
  }
}
