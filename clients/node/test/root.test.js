// docs/protocol.md §12.1.1: the market's trust root. Every first record of the vectors gets the
// verdict the document gives it (the Python reader is tested against the same vectors).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { rootVerdict, readRoot, MarketRootError, fromHex } from '../src/index.js';
import { embeddedJson } from '../src/protocol-doc.js';

const here = dirname(fileURLToPath(import.meta.url));
const docs = process.env.EMARKET_DOCS ?? join(here, '..', '..', '..', 'docs');
const v = embeddedJson(join(docs, 'protocol.md'), '<!-- root vectors: begin -->', '<!-- root vectors: end -->');

test('protocol.md §12.1.1: the trust root vectors', () => {
  assert.ok(v.cases.length >= 10);
  for (const c of v.cases) {
    const value = c.value_hex === null ? null : Buffer.from(fromHex(c.value_hex));
    assert.deepEqual(rootVerdict(v.topic, value, c.pinned), { verdict: c.verdict, key: c.key }, c.name);
  }
});

test('a spoiled root names the record and what to do', () => {
  assert.throws(() => readRoot('t.market', 3, null), (err) => err instanceof MarketRootError && err.reason === 'tombstone'
    && err.message.includes('t.market (partition 0, offset 3)') && err.message.includes('delete the topic t.market'));
});
