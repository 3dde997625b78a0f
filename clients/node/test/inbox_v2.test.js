// docs/vectors/inbox_v2.json (docs/protocol.md §8.5.8): routes, records and the records a reader
// must skip, computed from the spec alone; and a v2 reader's view of a partition holding them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import {
  inboxRoute, inboxSignedBytes, paddedLength, sealInboxRecord, openInboxRecord, InboxRecordError, SharedInbox, murmur2,
  readRoot, inboxMode, rootVerdict, MarketRootError, keyId, sha256Of, fromHex, toHex, utf8, INBOX_V2_HEAD,
} from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const docs = process.env.EMARKET_DOCS ?? join(here, '..', '..', '..', 'docs');
const v = JSON.parse(readFileSync(join(docs, 'vectors', 'inbox_v2.json'), 'utf8'));
const routeOf = (name) => v.routes.find((r) => r.account_id === name);
const text = (b) => new TextDecoder().decode(b);
const sha = (s) => toHex(sha256Of(s));

test('inbox_v2.json: the head of the signed bytes', () => {
  assert.equal(toHex(INBOX_V2_HEAD), v.head);
});

for (const r of v.routes) {
  test(`inbox_v2.json: ${r.account_id}'s route, seal key and partitions (§8.5.3)`, () => {
    const got = inboxRoute({ prefix: v.market, accountId: r.account_id, sealingPrivate: fromHex(r.sealing_private_key), marketSealingKey: v.market_sealing_key });
    assert.equal(toHex(got.shared), r.shared);
    assert.equal(toHex(got.salt), r.salt);
    assert.equal(toHex(got.routeInfo), r.route_info);
    assert.equal(toHex(got.sealInfo), r.seal_info);
    assert.equal(got.route, r.route);
    assert.equal(toHex(got.sealKey), r.seal_key);
    assert.equal(murmur2(utf8(got.route)), r.murmur2);
    for (const [n, p] of Object.entries(r.partitions)) {
      const at = inboxRoute({ prefix: v.market, accountId: r.account_id, sealingPrivate: fromHex(r.sealing_private_key), marketSealingKey: v.market_sealing_key, partitions: Number(n) });
      assert.equal(at.partition, p, `${n} partitions`);
    }
  });
}

for (const rec of v.records) {
  const messages = rec.messages.map((m) => ({ request: m.request_sha256, key: m.key, value: m.value }));
  const r = routeOf(rec.account_id);

  test(`inbox_v2.json: the record to ${rec.account_id}, made as the market makes it (§8.5.4)`, () => {
    assert.equal(rec.key, r.route);
    assert.equal(toHex(inboxSignedBytes({ prefix: v.market, accountId: rec.account_id, messages })), rec.signed_bytes);
    const made = sealInboxRecord({ prefix: v.market, accountId: rec.account_id, messages, marketSeed: fromHex(v.market_private_key), route: r.route, sealKey: fromHex(r.seal_key) });
    assert.equal(toHex(made.signature), rec.signature);
    assert.equal(made.unpadded, rec.plaintext_length);
    assert.equal(made.plaintext.length, rec.padded_length);
    assert.equal(paddedLength(rec.plaintext_length), rec.padded_length);
    assert.equal(toHex(made.nonce), rec.nonce);
    assert.equal(toHex(made.value), rec.value);
  });

  test(`inbox_v2.json: ${rec.account_id} opens her record and finds its messages, in order (§8.5.5)`, () => {
    const got = openInboxRecord({ key: Buffer.from(rec.key), value: fromHex(rec.value), route: r.route, sealKey: fromHex(r.seal_key), prefix: v.market, accountId: rec.account_id, marketPublicKey: v.market_public_key });
    assert.deepEqual(got.map((m) => ({ request: m.request, key: m.key, value: text(m.value) })), messages);
  });
}

test('inbox_v2.json: the answer is bound to the SHA-256 of the request, the delivery to none', () => {
  const [answer, delivery] = v.records[0].messages;
  assert.equal(answer.request_sha256, sha(v.request));
  assert.equal(delivery.request_sha256, null);
});

test('inbox_v2.json: the padded lengths of §8.5.4', () => {
  assert.deepEqual([1, 256, 257, 65536, 65537, 131073].map(paddedLength), [256, 256, 512, 65536, 131072, 196608]);
});

for (const f of v.refused) {
  test(`inbox_v2.json refused: ${f.name} — alice's reader skips it`, () => {
    const a = routeOf('alice');
    assert.throws(
      () => openInboxRecord({ key: a.route, value: fromHex(f.value), route: a.route, sealKey: fromHex(a.seal_key), prefix: v.market, accountId: 'alice', marketPublicKey: v.market_public_key }),
      InboxRecordError,
    );
  });
}

test('a record is opened only under its own route: bob\'s, read by alice, is not hers', () => {
  const a = routeOf('alice');
  const bob = v.records.find((x) => x.account_id === 'bob');
  assert.throws(
    () => openInboxRecord({ key: bob.key, value: fromHex(bob.value), route: a.route, sealKey: fromHex(a.seal_key), prefix: v.market, accountId: 'alice', marketPublicKey: v.market_public_key }),
    /not this account's route/,
  );
  // under alice's route, bob's sealed bytes do not open with alice's seal key
  assert.throws(
    () => openInboxRecord({ key: a.route, value: fromHex(bob.value), route: a.route, sealKey: fromHex(a.seal_key), prefix: v.market, accountId: 'alice', marketPublicKey: v.market_public_key }),
    /does not open/,
  );
});

test('a v2 reader\'s view of one partition: its own messages, others\' records skipped by key, forgeries under its route warned of once', () => {
  const warned = [];
  const client = { prefix: v.market, marketPublicKey: v.market_public_key, topic: (n) => `${v.market}.${n}`, warnOnce: (where, m) => warned.push([where, m]) };
  const alice = routeOf('alice');
  const view = new SharedInbox(client, 'alice', [{ sealingPrivate: fromHex(alice.sealing_private_key) }], { version: 2, partitions: v.inbox_partitions, sealingKey: v.market_sealing_key });
  assert.deepEqual(view.partitions, [alice.partitions[String(v.inbox_partitions)]]);
  const partition = [
    ...v.records.map((x) => ({ key: x.key, value: x.value })),
    ...v.refused.map((x) => ({ key: alice.route, value: x.value })),
  ].map((x, offset) => ({ key: Buffer.from(x.key), value: Buffer.from(fromHex(x.value)), partition: 3, offset: String(offset) }));
  const read = () => partition.flatMap((rec) => view.messages(rec));
  const got = read();
  assert.deepEqual(got.map((m) => m.doc.type), ['purchase_fulfilled', 'value_released']);
  assert.equal(got[0].request, v.records[0].messages[0].request_sha256);
  assert.equal(got[1].request, null);
  assert.equal(got[0].valueSha256, sha(v.records[0].messages[0].value)); // what §12.4's resend rule compares
  assert.deepEqual(warned.map(([where]) => where), v.refused.map((_, k) => `t.inbox[3]@${v.records.length + k}`));
  read(); // read again: each record opened once, each warning said once
  assert.equal(warned.length, v.refused.length);
});

test('the market\'s identity says which inboxes it has (§8.5.1); v2 without its partitions or key is no trust root', () => {
  const base = { type: 'market_identity', schema_version: 1, noise_secret_fingerprint: '0'.repeat(32), noise_derivation: 'x', noise_check: '0'.repeat(64), market_key_id: keyId(v.market_public_key), market_public_key: v.market_public_key, created_at_ms: 1 };
  const bytes = (d) => utf8(JSON.stringify(d));
  assert.deepEqual(inboxMode(readRoot('t.market', 0, bytes(base))), { version: 1 });
  const v2 = { ...base, inboxes: 2, inbox_partitions: 4, market_sealing_key: v.market_sealing_key };
  assert.deepEqual(inboxMode(readRoot('t.market', 0, bytes(v2))), { version: 2, partitions: 4, sealingKey: v.market_sealing_key });
  for (const drop of ['inbox_partitions', 'market_sealing_key']) {
    const { [drop]: _, ...bad } = v2;
    assert.throws(() => readRoot('t.market', 0, bytes(bad)), (e) => e instanceof MarketRootError && e.reason === 'malformed' && e.message.includes(drop));
  }
  for (const bad of [{ ...v2, inboxes: 3 }, { ...v2, inbox_partitions: 0 }, { ...v2, inbox_partitions: 1025 }]) {
    assert.equal(rootVerdict('t.market', bytes(bad), null).verdict, 'malformed');
  }
});
