// docs/vectors/negative.json (docs/protocol.md §10.1): what a client must refuse, with the reason.
// The Python tests run the same file, and replay its market cases against the market's core.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { verifyAnswer, requestDigest, namedAnswer, verifyOutcome, open, rootVerdict, fromHex, fromB64, utf8 } from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const docs = process.env.EMARKET_DOCS ?? join(here, '..', '..', '..', 'docs');
const v = JSON.parse(readFileSync(join(docs, 'vectors', 'negative.json'), 'utf8'));

test('negative.json: an answer is believed only for the bytes sent (§12.2–§12.4)', () => {
  const sent = requestDigest(utf8(v.answers.request));
  assert.ok(v.answers.cases.length >= 12);
  for (const c of v.answers.cases) {
    const headers = c.headers.map(([k, h]) => [k, h === null ? null : Buffer.from(fromHex(h))]);
    const got = verifyAnswer({ prefix: v.market, topic: c.topic, value: utf8(c.value), headers, marketPublicKey: v.market_public_key });
    const verdict = !got.ok ? 'refuse' : got.request === sent ? 'answer' : 'other';
    assert.equal(verdict, c.verdict, `${c.name} (${c.reason})`);
  }
});

test('negative.json: a receipt is verified or refused (§11)', () => {
  for (const c of v.receipts) {
    let verdict = 'valid';
    try {
      verifyOutcome(c.outcome, v.market_public_key, { sealedCiphertext: c.outcome.sealed?.ciphertext });
    } catch {
      verdict = 'refuse';
    }
    assert.equal(verdict, c.verdict, `${c.name} (${c.reason})`);
  }
});

test('negative.json: an envelope opens only as sealed (§4.3, §4.6)', () => {
  for (const c of v.envelopes) {
    let verdict = 'opens';
    try {
      open(c.envelope, fromHex(c.private_key), utf8(c.aad));
    } catch {
      verdict = 'refuse';
    }
    assert.equal(verdict, c.verdict, `${c.name} (${c.reason})`);
  }
});

test('negative.json: a root that is not the market\'s is refused (§12.1.1)', () => {
  assert.ok(v.roots.cases.length >= 8);
  for (const c of v.roots.cases) {
    const value = c.value_hex === null ? null : Buffer.from(fromHex(c.value_hex));
    assert.deepEqual(rootVerdict(v.roots.topic, value, c.pinned), { verdict: c.verdict, key: null }, c.name);
  }
});

test('negative.json: every market case names a code of §9 and bytes a reader can take', () => {
  const spec = readFileSync(join(docs, 'protocol.md'), 'utf8').split('\n## 9. Rejections\n')[1].split('\n## 10.')[0];
  assert.ok(v.market_cases.length >= 45);
  for (const c of v.market_cases) {
    assert.ok(spec.includes(`\`${c.code}\``), c.code);
    for (const e of [...c.setup, c.input]) {
      assert.ok(typeof e.topic === 'string' && e.topic.startsWith(`${v.market}.`), c.why);
      if ('value' in e) JSON.parse(e.value);
      else assert.ok(e.value_hex === null || /^([0-9a-f]{2})*$/.test(e.value_hex), c.why);
    }
  }
  for (const code of Object.keys(v.unreached)) assert.ok(spec.includes(`\`${code}\``), code);
  assert.ok(fromB64(v.market_public_key).length === 32);
});

test('negative.json: a resend takes the answer its notice names (§12.4)', () => {
  const rs = v.resend;
  for (const c of rs.cases) {
    const earlier = c.earlier
      .map((i) => ({ doc: JSON.parse(rs.answers[i]), valueSha256: requestDigest(utf8(rs.answers[i])) }))
      .filter(({ doc }) => (doc.purchase_id ?? doc.request_id) === rs.request_id && doc.stream_id === rs.stream_id);
    const got = namedAnswer({ reason: 'already_answered', details: c.details }, earlier);
    assert.deepEqual(got, c.taken === null ? undefined : JSON.parse(rs.answers[c.taken]), c.name);
  }
});
