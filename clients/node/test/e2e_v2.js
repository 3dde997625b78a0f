#!/usr/bin/env node
// End to end against a live market made with v2 inboxes (docs/protocol.md §8.5): EMARKET_BROKER,
// EMARKET_PREFIX, EMARKET_MARKET_KEY (else read from <prefix>.market) and a scratch directory
// (argv[2] or EMARKET_SCRATCH). The client learns the inboxes from the market's identity; a
// seller and a buyer open accounts, answered on their routes' partitions (no topic is made for
// them); an account without a sealing key is refused (on <p>.refusals: it has no inbox); records
// forged under the buyer's route are skipped with a warning, another route's record silently;
// the buyer buys (sealed releases opened, receipt verified) and gets a delivery, the seller a
// sale; the buyer rotates its keys (a new route, on another partition), buys again, still reads
// what was sealed under the old route, and a purchase sent again by a new process is answered
// by its first outcome.
// Writes e2e.json (ids, key files, market key) to the scratch directory. Exits 1 on a failure.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { steps } from './steps.js';
import { MarketClient, Party, Refused, inboxRoute, sealInboxRecord, toHex } from '../src/index.js';

const broker = process.env.EMARKET_BROKER;
const prefix = process.env.EMARKET_PREFIX ?? 'emarket';
const scratch = process.argv[2] ?? process.env.EMARKET_SCRATCH;
if (!broker || !scratch) {
  console.error('usage: EMARKET_BROKER=host:port EMARKET_PREFIX=p node test/e2e_v2.js SCRATCH_DIR');
  process.exit(2);
}
mkdirSync(scratch, { recursive: true });
const tag = toHex(randomBytes(3));
const { log, warn, warnings, check, step } = steps();

const seller = Party.generate(`vseller-${tag}`); // a v2 account needs a sealing key, a seller too
const buyer = Party.generate(`vbuyer-${tag}`);
const files = { seller: join(scratch, `${seller.accountId}.key`), buyer: join(scratch, `${buyer.accountId}.key`) };
seller.save(files.seller);
buyer.save(files.buyer);
const opts = { broker, prefix, marketPublicKey: process.env.EMARKET_MARKET_KEY || null, warn, timeoutMs: 30000 };
const S = new MarketClient({ ...opts, party: seller });
const B = new MarketClient({ ...opts, party: buyer });
const stream = `vtemp-${tag}`;
const inbox = `${prefix}.inbox`;
let failed = false;
try {
  await step('connect: the market\'s identity says v2 inboxes, and how many partitions', async () => {
    await S.connect();
    await B.connect();
    check(B.inboxes.version === 2 && B.inboxes.partitions >= 1 && B.inboxes.sealingKey, `inboxes ${JSON.stringify(B.inboxes)}`);
    check((await B.partitionCount(inbox)) === B.inboxes.partitions, `${inbox} has the identity's partitions`);
  });
  await step('open the seller\'s and the buyer\'s accounts, answered on <p>.inbox: no topic per account', async () => {
    for (const [c, p] of [[S, seller], [B, buyer]]) {
      const acc = await c.openAccount();
      check(acc.key_id === p.keyId && acc.sealing_key === p.sealingKey, 'account pins our keys');
      const read = [...c.readers.keys()].filter((t) => t.startsWith(`${prefix}.inbox`));
      check(read.join() === `${inbox}#${c.inboxView().partitions.join(',')}`, `read its route's partition of ${inbox} alone: ${read}`);
      const [route] = c.inboxView().routes.values();
      check(c.inboxWhere() === `${inbox} partition ${route.partition}, records keyed ${route.route}`, `where: ${c.inboxWhere()}`);
    }
    const topics = await B.admin.listTopics();
    check(!topics.some((t) => t.startsWith(`${prefix}.inbox.`)), `no topic per account: ${topics.filter((t) => t.startsWith(`${prefix}.inbox.`))}`);
  });
  await step('an account without a sealing key: the client says so, and the market refuses it on <p>.refusals', async () => {
    const plain = Party.generate(`vplain-${tag}`, { sealing: false });
    const c = new MarketClient({ ...opts, party: plain, marketPublicKey: B.marketPublicKey });
    await c.connect();
    try {
      const local = await c.openAccount().then(() => null, (e) => e);
      check(local instanceof Refused && local.reason === 'encryption_required' && /--no-sealing/.test(local.detail), `told before sending: ${local}`);
      const sent = await c.send({ type: 'open_account', account_id: plain.accountId, signing_key: plain.signingKey, sealing_key: null, opened_at_ms: Date.now() });
      const err = await c.answer(sent).then(() => null, (e) => e);
      check(err instanceof Refused && err.reason === 'encryption_required', `the market's refusal: ${err}`);
    } finally {
      await c.close();
    }
  });
  await step('register a stream and publish two sealed values', async () => {
    const entry = await S.register({ stream_id: stream, mechanism: 'laplace', sensitivity: 1.0, dimension: 2, steps: [0.5, 1.0, 2.0, 4.0], cap: 4.0, pricing: { kind: 'linear_level', rate_per_level: 100.0 } });
    check(entry.market_sealing_key === B.inboxes.sealingKey, 'the catalog\'s sealing key is the identity\'s');
    const ans = await S.publish(stream, [{ value_id: 'v1', values: [20.25, 1.5] }, { value_id: 'v2', values: [19.75, 3.5] }]);
    check(ans.outcomes.every((o) => o.status === 'accepted'), `accepted: ${JSON.stringify(ans.outcomes)}`);
  });
  await step('records forged under the buyer\'s route are skipped with a warning, another route\'s silently', async () => {
    const [route] = B.inboxView().routes.values();
    const evil = sealInboxRecord({ prefix, accountId: buyer.accountId, messages: [{ request: null, key: 'x', value: '{"type":"value_released"}' }], marketSeed: new Uint8Array(randomBytes(32)), route: route.route, sealKey: route.sealKey });
    await B.producer.send({
      topic: inbox,
      messages: [
        { key: route.route, value: Buffer.concat([Buffer.of(2), randomBytes(300)]), partition: route.partition },
        { key: route.route, value: Buffer.from(evil.value), partition: route.partition },
        { key: toHex(randomBytes(16)), value: Buffer.from('not a record'), partition: route.partition },
      ],
    });
  });
  const bought = [];
  await step('buy the first step: releases opened, receipt verified', async () => {
    const out = await B.buy(stream, { maxPriceMinor: 50 });
    check(out.level_after === 0.5 && out.releases.length === 2 && out.receipt.ciphertext_digest, `bought: ${JSON.stringify(out).slice(0, 300)}`);
    bought.push(out);
  });
  await step('a new value reaches the buyer as a delivery', async () => {
    await S.publish(stream, [{ value_id: 'v3', values: [21.0, 2.0] }]);
    const has = (d) => d.type === 'value_released' && d.releases?.some((r) => r.value_id === 'v3');
    const msgs = await B.inboxMessages({ ms: 30000, until: has });
    const d = msgs.find(has);
    check(d && d._delivery && d.releases[0].level === 0.5, 'a value_released with v3, at the level held');
  });
  await step('the seller reads a signed sale in its v2 inbox', async () => {
    // a `sales` notice lists a batch's sales (§8.4); an earlier market's `sale` is one
    const listed = (m) => (m.type === 'sales' ? m.sales.map((s) => ({ ...s, _delivery: m._delivery })) : m.type === 'sale' ? [m] : []);
    const msgs = await S.inboxMessages({ ms: 30000, until: (d) => listed(d).length > 0 });
    const sales = msgs.flatMap(listed).filter((s) => s.stream_id === stream);
    check(sales.length === 1 && sales[0]._delivery && sales[0].level_after === 0.5, `one sale: ${JSON.stringify(sales)}`);
  });
  await step('rotate the buyer\'s keys (a new route), buy again, and still read what the old route holds', async () => {
    const before = [...B.inboxView().routes.values()][0];
    // new keys whose route is on another partition (where there are several): the reader reads both
    let next;
    for (let k = 0; k < 64; k++) {
      next = Party.generate(buyer.accountId);
      const r = inboxRoute({ prefix, accountId: buyer.accountId, sealingPrivate: next.sealingPrivate, marketSealingKey: B.inboxes.sealingKey, partitions: B.inboxes.partitions });
      if (r.partition !== before.partition || B.inboxes.partitions === 1) break;
    }
    const { account } = await B.rotateKeys(next);
    const now = [...B.inboxView().routes.values()];
    check(account.version === 2 && now.length === 2 && now[0].route !== before.route, 'version 2 under a new route, the old one still read');
    log(`     route partition ${before.partition} -> ${now[0].partition} of ${B.inboxes.partitions}`);
    const out = await B.buy(stream, { maxPriceMinor: 200 });
    check(out.level_after === 1.0 && out.releases.length === 3, `bought ${out.level_after} with ${out.releases.length} releases`);
    const msgs = await B.inboxMessages({ ms: 10000, until: (d, got) => got.filter((m) => m.type === 'purchase_fulfilled').length >= 2 });
    const fulfilled = msgs.filter((m) => m.type === 'purchase_fulfilled');
    check(fulfilled.length === 2 && fulfilled.every((m) => m.releases?.length && !m._unopened), 'both purchases, opened, one under each route');
    check(msgs.filter((m) => m.type === 'account').map((m) => m.version).sort().join() === '1,2', 'both account states');
  });
  await step('a purchase sent again by a new process is answered by its first outcome', async () => {
    const first = await B.buy(stream, { purchaseId: `cap-${tag}`, targetLevel: 4.0, maxPriceMinor: 400 });
    const again = await B.buy(stream, { purchaseId: `cap-${tag}`, targetLevel: 4.0, maxPriceMinor: 400 });
    check(again.receipt.signature === first.receipt.signature, 'the same receipt');
  });
  writeFileSync(join(scratch, 'e2e.json'), JSON.stringify({ seller: seller.accountId, seller_key: files.seller, buyer: buyer.accountId, stream, market_public_key: S.marketPublicKey }, null, 2));
  const trusted = warnings.filter((w) => w.startsWith('trusting the market key'));
  const skipped = warnings.filter((w) => !trusted.includes(w));
  check(trusted.length === (process.env.EMARKET_MARKET_KEY ? 0 : 2), `a key trusted on first use is named: ${trusted.join('; ')}`);
  check(skipped.length === 2 && skipped.every((w) => w.includes('not written by the market to it')), `only the two forged records were skipped: ${skipped.join('; ')}`);
  log('all steps passed');
} catch (err) {
  failed = true;
  console.error(`e2e failed: ${err.message}`);
} finally {
  await S.close();
  await B.close();
}
process.exit(failed ? 1 : 0);
