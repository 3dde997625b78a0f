// Every vector of docs/vectors/*.json and of docs/protocol.md that a client computes: §2.4, §3.6,
// §4.4, §8.4, §11.7, §12.6 and the four files of §10 (§6.8's worked example is §2.4's version 3).
// The noise vectors of §1.8 are the market's: a client never computes noise.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { x25519 } from '@noble/curves/ed25519';
import { hkdf } from '@noble/hashes/hkdf';
import { sha256 } from '@noble/hashes/sha2';
import { hmac } from '@noble/hashes/hmac';
import {
  canonicalBytes, marketRef, validSigningKey, signBytes, verifyBytes, verifyEvent, keyId, Party, fromHex, toHex, toB64, fromB64, utf8,
  valuesAad, seal, open, sealBatch, openReleases, envelopeKey, receiptBytes, releasesDigest, commitment,
  verifyReceipt, verifyOutcome, ReceiptInvalid, answerBytes, verifyAnswer, stringKey, murmur2, partitionOf,
  stateKeys, stateStamp, stateAad, openState, entryDigest, encodeIdentity, workBytes, solveWork,
  leadingZeroBits, sha256Of,
} from '../src/index.js';
import { embeddedJson } from '../src/protocol-doc.js';

const here = dirname(fileURLToPath(import.meta.url));
const docs = process.env.EMARKET_DOCS ?? join(here, '..', '..', '..', 'docs');
const PROTOCOL = join(docs, 'protocol.md');
const vec = (name) => JSON.parse(readFileSync(join(docs, 'vectors', name), 'utf8'));
const signing = vec('signing.json');
const MARKET = marketRef(signing.market, signing.market_key_id);
const sealing = vec('sealing.json');
const keys = vec('keys.json');

test('signing.json: the signer\'s keys and key ids', () => {
  for (const s of [signing.signer, signing.new_signer]) {
    const p = new Party({ accountId: 'x', signingSeed: fromHex(s.ed25519_private_key), sealingPrivate: s.x25519_private_key ? fromHex(s.x25519_private_key) : null });
    assert.equal(p.signingKey, s.public_key);
    assert.equal(p.keyId, s.key_id);
    if (s.sealing_key) assert.equal(p.sealingKey, s.sealing_key);
  }
});

for (const v of signing.events) {
  test(`signing.json: ${v.name}`, () => {
    const seed = fromHex(signing.signer.ed25519_private_key);
    const bytes = canonicalBytes(v.event, MARKET, v.key_version);
    assert.equal(toHex(bytes), v.canonical_bytes);
    assert.equal(signBytes(seed, bytes), v.signature);
    assert.equal(v.event.signature, v.signature);
    assert.ok(verifyEvent(v.event, MARKET, signing.signer.public_key, v.key_version));
    if (v.event.type === 'rotate_keys') {
      assert.ok(verifyBytes(signing.new_signer.public_key, bytes, v.event.new_key_signature));
      assert.equal(signBytes(fromHex(signing.new_signer.ed25519_private_key), bytes), v.event.new_key_signature);
    }
    // Spelled out with every default, the bytes do not change (§2.5).
    assert.ok(verifyEvent(JSON.parse(JSON.stringify(v.event)), MARKET, signing.signer.public_key, v.key_version));
  });
}

test('signing.json: purchase with defaults spelled out signs alike (§2.5)', () => {
  const v = signing.events.find((e) => e.name === 'purchase, defaults');
  const full = { ...v.event, target_level: null, currency: 'EUR', accuracy: null, most_accurate: false };
  assert.equal(toHex(canonicalBytes(full, MARKET, 1)), v.canonical_bytes);
});

test('signing.json: negative_zero verifies for every spelling', () => {
  const nz = signing.negative_zero;
  for (const text of nz.texts) {
    const ev = JSON.parse(text);
    assert.equal(toHex(canonicalBytes(ev, MARKET, 1)), nz.canonical_bytes);
    assert.ok(verifyBytes(signing.signer.public_key, fromHex(nz.canonical_bytes), ev.signature));
  }
  assert.equal(signBytes(fromHex(signing.signer.ed25519_private_key), fromHex(nz.canonical_bytes)), nz.signature);
});

test('protocol.md §2.4: the signing table (versions 1 and 3)', () => {
  const text = readFileSync(PROTOCOL, 'utf8');
  const block = text.slice(text.indexOf('<!-- signing vectors: begin -->'), text.indexOf('<!-- signing vectors: end -->'));
  const rows = [...block.matchAll(/^\| (\d+) \| `([0-9a-f]+)` \| `([A-Za-z0-9+/=]+)` \|$/gm)];
  assert.equal(rows.length, 2);
  const ev = { type: 'purchase', purchase_id: 'p1', buyer_id: 'alice', stream_id: 'temp', max_price_minor: 100, requested_at_ms: 1000 };
  for (const [, g, hex, sig] of rows) {
    const b = canonicalBytes(ev, marketRef('t', '56475aa75463474c'), Number(g));
    assert.equal(toHex(b), hex);
    assert.equal(signBytes(fromHex('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f'), b), sig);
    // the same prefix with another market key: another market, and the signature verifies not
    const elsewhere = canonicalBytes(ev, marketRef('t', '0123456789abcdef'), Number(g));
    assert.equal(verifyBytes('A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=', elsewhere, sig), false);
  }
  assert.throws(() => canonicalBytes(ev, 't', 1), /prefix and its key id/);
});

test('protocol.md §5.1: negative key and signature vectors', () => {
  const text = readFileSync(PROTOCOL, 'utf8');
  const signing = text.slice(text.indexOf('<!-- signing vectors: begin -->'), text.indexOf('<!-- signing vectors: end -->'));
  const message = fromHex([...signing.matchAll(/^\| 1 \| `([0-9a-f]+)`/gm)][0][1]);
  const block = text.slice(text.indexOf('<!-- negative key vectors: begin -->'), text.indexOf('<!-- negative key vectors: end -->'));
  const rows = [...block.matchAll(/^\| ([^|`]+) \| `([A-Za-z0-9+/=]+)` \| `([A-Za-z0-9+/=]+)` \| `?(\w+)`? \| (\w+) \|$/gm)];
  assert.equal(rows.length, 5);
  for (const [, name, key, sig, opening, verdict] of rows) {
    assert.equal(validSigningKey(key), opening === 'accepted', name);
    assert.equal(verifyBytes(key, message, sig), verdict === 'verifies', name);
  }
});

function checkSealingIntermediates(s, sellerId, { ephemeral, nonce }) {
  const k = fromB64(s.market_sealing_key);
  assert.equal(toB64(x25519.getPublicKey(fromHex(s.market_private_key ?? s.market_private_key_hex))), s.market_sealing_key);
  // §4.1: the market derives its private key from the noise secret.
  const secret = fromHex(s.noise_secret ?? s.noise_secret_hex);
  assert.equal(toHex(hmac(sha256, secret, utf8('emarket market sealing key v1'))), s.market_private_key ?? s.market_private_key_hex);
  const aad = valuesAad({ prefix: s.market, marketSealingKey: s.market_sealing_key, streamId: s.stream_id, sellerId, items: s.items });
  assert.equal(toHex(aad), s.aad ?? s.aad_hex);
  const epk = x25519.getPublicKey(ephemeral);
  const shared = x25519.getSharedSecret(ephemeral, k);
  assert.equal(toHex(envelopeKey(shared, epk, k)), s.hkdf_key ?? s.hkdf_key_hex);
  const env = seal(utf8(s.plaintext), k, aad, { ephemeral, nonce });
  assert.deepEqual(env, s.sealed);
  // The market opens it; the plaintext reads as the items' numbers.
  const back = JSON.parse(new TextDecoder().decode(open(env, fromHex(s.market_private_key ?? s.market_private_key_hex), aad)));
  assert.deepEqual(back, s.items.map((it) => ({ values: it.values })));
  // A batch sealed by this client (its JSON spelling of the numbers) opens to the same numbers.
  const ev = sealBatch({ prefix: s.market, marketSealingKey: s.market_sealing_key, streamId: s.stream_id, sellerId, items: s.items, ephemeral, nonce });
  const mineRaw = open(ev.sealed, fromHex(s.market_private_key ?? s.market_private_key_hex), aad);
  const mine = JSON.parse(new TextDecoder().decode(mineRaw));
  assert.deepEqual(mine, back);
  if (s.padded_length !== undefined) {
    // §4.2: any spelling is valid, and every spelling pads to the same length: this client's
    // (JSON.stringify: -2, 0, 42) differs from the vector's (-2.0, 0.0, 42.0) and fills the
    // same bytes; the rule measured on the vector's own spelling gives them too.
    assert.notEqual(new TextDecoder().decode(mineRaw), s.plaintext);
    assert.equal(mineRaw.length, s.padded_length);
    let size = utf8(s.plaintext.trimEnd()).length;
    for (const j of s.numbers_json) size += 25 * JSON.parse(j).length + 1 - j.length;
    assert.equal(size, s.padded_length);
  }
  return env;
}

test('sealing.json: every step of §4.5', () => {
  const s = sealing;
  const ephemeral = fromHex(s.ephemeral_private_key);
  assert.equal(toHex(x25519.getPublicKey(ephemeral)), s.epk);
  assert.equal(toHex(x25519.getSharedSecret(ephemeral, fromB64(s.market_sealing_key))), s.shared_secret);
  assert.equal(toHex(fromHex(s.epk)) + toHex(fromB64(s.market_sealing_key)), s.hkdf_salt);
  assert.equal(s.hkdf_info, 'epsilon-market release v1');
  assert.equal(toHex(hkdf(sha256, fromHex(s.shared_secret), fromHex(s.hkdf_salt), utf8(s.hkdf_info), 32)), s.hkdf_key);
  assert.equal(s.nonce, toHex(fromB64(s.sealed.nonce)));
  checkSealingIntermediates(s, s.seller_id, { ephemeral, nonce: fromHex(s.nonce) });
  // The sealed batch of signing.json carries this envelope.
  const v = signing.events.find((e) => e.event.type === 'values' && e.event.sealed);
  assert.deepEqual(v.event.sealed, s.sealed);
});

test('sealing.json: a release sealed to the buyer opens (§4.6)', () => {
  const r = sealing.release_to_buyer;
  const priv = fromHex(r.buyer_private_key);
  assert.equal(toB64(x25519.getPublicKey(priv)), r.buyer_sealing_key);
  assert.equal(toHex(x25519.getSharedSecret(priv, fromB64(r.sealed.epk))), r.shared_secret);
  assert.equal(toHex(envelopeKey(fromHex(r.shared_secret), fromB64(r.sealed.epk), fromB64(r.buyer_sealing_key))), r.hkdf_key);
  const ev = { type: r.event, purchase_id: r.purchase_id, releases: [], sealed: r.sealed };
  assert.equal(toHex(utf8(r.purchase_id)), r.aad);
  const raw = open(r.sealed, priv, utf8(r.purchase_id));
  assert.equal(raw.length, r.padded_length);
  assert.equal(new TextDecoder().decode(raw).trimEnd(), r.plaintext);
  // §11.5: the numbers summed are those of each release's `values`, as spelled in the plaintext
  let size = utf8(r.plaintext).length;
  for (const j of r.numbers_json) {
    assert.ok(r.plaintext.includes(j), j);
    size += 25 * JSON.parse(j).length + 1 - j.length;
  }
  assert.equal(size, r.padded_length);
  const opened = openReleases(ev, priv);
  assert.equal(opened.opening, r.opening);
  assert.deepEqual(opened.releases, JSON.parse(r.plaintext).releases);
});

test('protocol.md §4.4: the sealed-values vector', () => {
  const s = embeddedJson(PROTOCOL, '<!-- sealed-values vector -->');
  checkSealingIntermediates(s, s.seller_id, { ephemeral: fromHex(s.ephemeral_private_key_hex), nonce: fromHex(s.nonce_hex) });
});

test('keys.json: string keys (§7)', () => {
  assert.equal(keys.string_key_label, toHex(utf8('emarket-histogram-key-v1\0')));
  for (const k of keys.string_keys) {
    assert.equal(toHex(utf8(k.text)), k.utf8, k.text);
    assert.equal(toHex(utf8(k.text.normalize('NFC'))), k.nfc_utf8, k.text);
    assert.equal(toHex(sha256(fromHex(keys.string_key_label + k.nfc_utf8))), k.sha256);
    assert.equal(stringKey(k.text), k.key, k.text);
  }
});

test('keys.json: key ids (§5)', () => {
  for (const k of keys.key_ids) {
    const p = new Party({ accountId: 'x', signingSeed: fromHex(k.ed25519_private_key) });
    assert.equal(toHex(fromB64(p.signingKey)), k.public_key_raw);
    assert.equal(p.signingKey, k.public_key);
    assert.equal(keyId(k.public_key), k.key_id);
  }
});

test('keys.json and §8.2: murmur2 and partitions', () => {
  for (const p of keys.partitions) {
    assert.equal(murmur2(utf8(p.key)), p.murmur2, p.key);
    // one hash, two spellings: unsigned and Kafka's signed Java int (§8.2)
    assert.equal(murmur2(utf8(p.key)) | 0, p.murmur2_signed, p.key);
    assert.equal(p.murmur2_signed >>> 0, p.murmur2, p.key);
    for (const [n, part] of Object.entries(p.partition)) assert.equal(partitionOf(p.key, Number(n)), part, `${p.key} of ${n}`);
  }
  // Kafka's own test cases, as signed 32-bit integers, are among the vectors' ids.
  assert.equal(murmur2(utf8('21')) | 0, -973932308);
  assert.equal(murmur2(utf8('foobar')) | 0, -790332482);
  const signed = Object.fromEntries(keys.partitions.map((p) => [p.key, p.murmur2_signed]));
  assert.deepEqual([signed['21'], signed.foobar], [-973932308, -790332482]);
});

test('protocol.md §3.6: state records, format 2', () => {
  const v = embeddedJson(PROTOCOL, '<!-- state vectors: begin -->', '<!-- state vectors: end -->');
  const [kSeal, kDigest] = stateKeys(fromHex(v.noise_secret));
  assert.equal(toHex(kSeal), v.seal_key);
  assert.equal(toHex(kDigest), v.digest_key);
  for (const r of [...v.records, v.checkpoint.record]) {
    const stamp = stateStamp(r);
    assert.equal(toHex(stamp), r.stamp);
    assert.equal(toHex(stateAad(r.store, fromHex(r.key), stamp, r.value == null)), r.aad);
    const got = openState(kSeal, r.store, fromHex(r.key), fromHex(r.header), r.value == null ? null : fromHex(r.value));
    assert.equal(got.plaintext == null ? null : toHex(got.plaintext), r.plaintext);
    const other = fromHex(r.key).slice();
    other[0] ^= 1; // moved to another key: the seal does not open
    assert.throws(() => openState(kSeal, r.store, other, fromHex(r.header), r.value == null ? null : fromHex(r.value)));
  }
  for (const d of v.digests) {
    assert.equal(entryDigest(kDigest, d.store, d.key, d.epoch, d.n).toString(16).padStart(64, '0'), d.digest);
  }
  assert.equal(JSON.stringify(JSON.parse(v.checkpoint.plaintext)), v.checkpoint.plaintext);
});

test('protocol.md §11.7: receipts', () => {
  const v = embeddedJson(PROTOCOL, '<!-- receipt vectors: begin -->', '<!-- receipt vectors: end -->');
  assert.equal(keyId(v.market_public_key), v.market_key_id);
  const secret = fromHex(v.noise_secret);
  const kOpen = hmac(sha256, secret, utf8('emarket receipt opening key v1'));
  assert.equal(toHex(kOpen), v.opening_key);
  for (const c of v.receipts) {
    const p = c.purchase;
    const id = encodeIdentity([['text', p.buyer_id], ['text', p.stream_id], ['text', p.purchase_id], ['integer', p.requested_at_ms], ['double', p.level_after]]);
    assert.equal(toHex(id), c.identity);
    assert.equal(toHex(hmac(sha256, kOpen, id)), c.opening);
    const version = c.receipt.receipt_version;
    assert.equal(toHex(releasesDigest(c.releases, version)), c.releases_digest);
    assert.equal(toHex(utf8('emarket receipt commitment v1\0')) + c.releases_digest, c.commitment_message);
    assert.equal(commitment(c.opening, c.releases, version), c.receipt.commitment);
    assert.equal(toHex(receiptBytes(c.receipt)), c.canonical_bytes);
    assert.equal(signBytes(fromHex(v.signing_private_key), receiptBytes(c.receipt)), c.signature);
    verifyReceipt(c.receipt, v.market_public_key);
    // Re-spelled by a JSON tool (2.0 → 2, members reordered), it still verifies.
    const respelled = JSON.parse(JSON.stringify(Object.fromEntries(Object.entries(c.receipt).reverse())));
    verifyReceipt(respelled, v.market_public_key);
    let event = { type: 'purchase_fulfilled', purchase_id: p.purchase_id, buyer_id: p.buyer_id, stream_id: p.stream_id, receipt: c.receipt, releases: c.releases, opening: c.opening };
    let sealedCiphertext;
    if (c.envelope) {
      const priv = fromHex(c.buyer_sealing_private_key);
      assert.equal(toB64(x25519.getPublicKey(priv)), c.buyer_sealing_key);
      const raw = open(c.envelope, priv, utf8(p.purchase_id));
      assert.equal(raw.length, c.padded_length);
      assert.equal(new TextDecoder().decode(raw).trimEnd(), c.plaintext);
      event = openReleases({ ...event, releases: [], opening: null, sealed: c.envelope }, priv);
      sealedCiphertext = c.envelope.ciphertext;
      assert.equal(toHex(sha256(fromB64(c.envelope.ciphertext))), c.receipt.ciphertext_digest);
    }
    verifyOutcome(event, v.market_public_key, { sealedCiphertext });
    // Another number, a wrong opening, a forged signature: each is refused.
    const bad = structuredClone(event);
    bad.releases[0].values[0] += 1;
    assert.throws(() => verifyOutcome(bad, v.market_public_key), ReceiptInvalid);
    assert.throws(() => verifyOutcome({ ...event, opening: '00'.repeat(32) }, v.market_public_key), ReceiptInvalid);
    assert.throws(() => verifyReceipt({ ...c.receipt, price_minor: c.receipt.price_minor + 1 }, v.market_public_key), ReceiptInvalid);
    assert.throws(() => verifyReceipt({ ...c.receipt, extra: 1 }, v.market_public_key), ReceiptInvalid);
  }
});

test('sales.json: a seller\'s sale notice (§8.4), from the text', () => {
  const v = vec('sales.json');
  const key = hmac(sha256, fromHex(v.noise_secret), utf8('emarket buyer pseudonym key v1'));
  assert.equal(toHex(key), v.pseudonym_key);
  const s = (x) => { const b = utf8(x); const n = new Uint8Array(5 + b.length); n[0] = 0x73; new DataView(n.buffer).setUint32(1, b.length); n.set(b, 5); return n; };
  const msg = new Uint8Array([...s(v.seller_id), ...s(v.buyer_id)]);
  assert.equal(toHex(msg), v.pseudonym_message);
  assert.equal(toHex(hmac(sha256, key, msg).subarray(0, 16)), v.buyer_ref);
  assert.equal(toHex(receiptBytes(v.receipt)), v.receipt_canonical_bytes);
  assert.equal(toHex(sha256(receiptBytes(v.receipt))), v.receipt_sha256);
  assert.equal(toHex(sha256(receiptBytes(v.second.receipt))), v.second.receipt_sha256);
  const msg2 = new Uint8Array([...s(v.seller_id), ...s(v.second.receipt.buyer_id)]);
  assert.equal(toHex(hmac(sha256, key, msg2).subarray(0, 16)), v.second.buyer_ref);
  const notice = JSON.parse(v.value); // one notice per seller and batch, listing its sales
  assert.deepEqual([notice.type, notice.seller_id, notice.sales.length], ['sales', v.seller_id, 2]);
  assert.equal(v.key, notice.sales[0].receipt_sha256); // keyed by the first sale listed
  for (const [sale, one] of [[notice.sales[0], v], [notice.sales[1], v.second]]) {
    assert.deepEqual([sale.buyer_ref, sale.receipt_sha256, sale.price_minor, sale.value_count], [one.buyer_ref, one.receipt_sha256, one.receipt.price_minor, one.receipt.value_ids.length]);
  }
  const old = JSON.parse(v.one_sale_value); // an earlier market's one-sale message: still read
  assert.deepEqual([old.type, old.seller_id, old.receipt_sha256, old.buyer_ref], ['sale', v.seller_id, v.receipt_sha256, v.buyer_ref]);
  assert.equal(toHex(answerBytes({ prefix: v.market, topic: v.topic, requestSha256: null, value: v.value })), v.signed_bytes);
  const headers = { 'emarket-answer': Buffer.from(v.header, 'hex') };
  const ok = verifyAnswer({ prefix: v.market, topic: v.topic, value: Buffer.from(v.value), headers, marketPublicKey: v.market_public_key });
  assert.deepEqual(ok, { ok: true, request: null }); // signed for the seller's inbox alone
});

test('protocol.md §12.6: answers the market signs', () => {
  const v = embeddedJson(PROTOCOL, '<!-- answer vectors: begin -->', '<!-- answer vectors: end -->');
  assert.equal(toHex(sha256(utf8(v.request))), v.messages[0].request_sha256);
  for (const m of v.messages) {
    const M = answerBytes({ prefix: v.market, topic: m.topic, requestSha256: m.request_sha256, value: m.value });
    assert.equal(toHex(M), m.signed_bytes);
    const sig = fromB64(signBytes(fromHex(v.market_private_key), M));
    const header = toHex(sig) && `01${toHex(sig)}${m.request_sha256 ?? ''}`;
    assert.equal(header, m.header);
    const headers = { 'emarket-answer': Buffer.from(m.header, 'hex') };
    const ok = verifyAnswer({ prefix: v.market, topic: m.topic, value: Buffer.from(m.value), headers, marketPublicKey: v.market_public_key });
    assert.deepEqual(ok, { ok: true, request: m.request_sha256 });
    // Copied into another inbox, or with another value, it does not verify.
    assert.equal(verifyAnswer({ prefix: v.market, topic: 't.inbox.bob', value: Buffer.from(m.value), headers, marketPublicKey: v.market_public_key }).ok, false);
    assert.equal(verifyAnswer({ prefix: v.market, topic: m.topic, value: Buffer.from(m.value + ' '), headers, marketPublicKey: v.market_public_key }).ok, false);
    assert.equal(verifyAnswer({ prefix: v.market, topic: m.topic, value: Buffer.from(m.value), headers: {}, marketPublicKey: v.market_public_key }).ok, false);
  }
});

test('protocol.md §6.1.2: the proof-of-work vector', () => {
  const v = embeddedJson(PROTOCOL, '<!-- work vectors: begin -->', '<!-- work vectors: end -->');
  const raw = workBytes(v.market_prefix, v.account_id, v.signing_key, v.work);
  assert.equal(toHex(raw), v.bytes);
  assert.equal(toHex(sha256Of(raw)), v.sha256);
  assert.equal(leadingZeroBits(sha256Of(raw)), v.bits);
  const w = solveWork(v.market_prefix, v.account_id, v.signing_key, 8);
  assert.ok(leadingZeroBits(sha256Of(workBytes(v.market_prefix, v.account_id, v.signing_key, w))) >= 8);
});

test('§5.2.1: the key file vector reads into its keys and is written back byte for byte', () => {
  const doc = readFileSync(PROTOCOL, 'utf8');
  const m = /<!-- key file vectors: begin -->\s*```json\n([\s\S]*?\n)```\s*<!-- key file vectors: end -->/.exec(doc);
  assert.ok(m, 'docs/protocol.md lost its key file vector');
  const text = m[1];
  assert.equal(toHex(sha256Of(utf8(text))), '90771144fb726afbb37a8fc3738ebb0688063debf4c4ed2f28c810f50e23f574');
  const p = Party.fromJSON(JSON.parse(text));
  assert.equal(p.keyId, '03396219237f75a6');
  assert.equal(p.keyVersion, 2);
  assert.deepEqual(p.sealingKeys().map((k) => [k.keyVersion, k.sealingKey]), [
    [2, 'Z13VdO13iTELPS52gfN5C0ZsdzsVIf7PNld5WDcepS8='],
    [1, 'NYBy1jZYgNGu6jKa35EhODhR7SGijjt16WXQ0s0WYlQ='],
  ]);
  assert.equal(p.keyFile(), text);
  const mixed = { ...JSON.parse(text), signing_key: 'A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=' };
  assert.throws(() => Party.fromJSON(mixed), /`signing_key` is not the public key/);
  assert.throws(() => Party.fromJSON({ ...JSON.parse(text), key_version: 1 }), /`previous` must list/);
});
