// The emarket command line, offline: exit codes and receipt verification of a vector's outcome.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { embeddedJson } from '../src/protocol-doc.js';

const here = dirname(fileURLToPath(import.meta.url));
const BIN = join(here, '..', 'bin', 'emarket.js');
const PROTOCOL = join(here, '..', '..', '..', 'docs', 'protocol.md');
const env = { PATH: process.env.PATH };
const run = (...args) => spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', env, timeout: 30000 });

test('keygen writes a key file once, and never overwrites it', () => {
  const dir = mkdtempSync(join(tmpdir(), 'emarket-'));
  const out = join(dir, 'a.key');
  const r = run('--json', 'keygen', '--account', 'alice', '--out', out);
  assert.equal(r.status, 0, r.stderr);
  assert.match(JSON.parse(r.stdout).key_id, /^[0-9a-f]{16}$/);
  assert.equal(run('keygen', '--account', 'alice', '--out', out).status, 2);
});

test('bad input exits 2 with a message', () => {
  assert.equal(run().status, 2);
  assert.equal(run('no-such-command').status, 2);
  assert.equal(run('--unknown-flag').status, 2);
  const r = run('account', 'open');
  assert.equal(r.status, 2);
  assert.match(r.stderr, /key-file/);
  for (const [flag, bad, says] of [['--batch-size', '0', /--batch-size takes 1 to 1000 values/], ['--batch-size', '1001', /1 to 1000/], ['--batch-delay', 'soon', /--batch-delay takes seconds/]]) {
    const b = run('publish', '--stream', 's', '--values', '1', flag, bad);
    assert.equal(b.status, 2);
    assert.match(b.stderr, says);
  }
});

test('verify-receipt: the sealed receipt vector verifies; one changed number does not', () => {
  const v = embeddedJson(PROTOCOL, '<!-- receipt vectors: begin -->', '<!-- receipt vectors: end -->');
  const c = v.receipts[0];
  const dir = mkdtempSync(join(tmpdir(), 'emarket-'));
  const outcome = { type: 'purchase_fulfilled', ...c.purchase, releases: c.releases, opening: c.opening, sealed: c.envelope, receipt: c.receipt };
  delete outcome.requested_at_ms;
  writeFileSync(join(dir, 'ok.json'), JSON.stringify(outcome));
  let r = run('verify-receipt', join(dir, 'ok.json'), '--public-key', v.market_public_key);
  assert.equal(r.status, 0, r.stderr);
  outcome.releases[0].values[0] = 1.25;
  writeFileSync(join(dir, 'bad.json'), JSON.stringify(outcome));
  r = run('verify-receipt', join(dir, 'bad.json'), '--public-key', v.market_public_key);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /receipt_invalid/);
  // The receipt alone: its signature is checked, its numbers cannot be.
  writeFileSync(join(dir, 'receipt.json'), JSON.stringify(c.receipt));
  assert.equal(run('verify-receipt', join(dir, 'receipt.json'), '--public-key', v.market_public_key).status, 0);
  assert.ok(existsSync(join(dir, 'receipt.json')));
});
