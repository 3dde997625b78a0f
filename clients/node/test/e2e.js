#!/usr/bin/env node
// End to end against a live market: EMARKET_BROKER (host:port), EMARKET_PREFIX, EMARKET_MARKET_KEY
// (else read from <prefix>.market) and a scratch directory (argv[2] or EMARKET_SCRATCH).
// A seller and a buyer open accounts; the seller registers a stream and a histogram stream and
// publishes sealed values; the buyer quotes, buys two steps, opens the sealed releases, verifies
// the receipts, receives a subscription delivery and names histogram keys; the seller finds a
// signed sale per purchase in its inbox (in `sales` notices); forged inbox messages
// are skipped, refusals reported (also from <p>.refusals), keys rotated, a resent purchase
// answered by its first outcome, and a forged catalog entry is not believed.
// Writes e2e.json (ids, market key) and the opened outcomes to the scratch directory.
// Exits 1 on any failure, naming the step.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { steps } from './steps.js';
import { MarketClient, Party, Refused, ValueBatcher, nameKeys, receiptBytes, sha256Of, stringKey, verifyOutcome, toHex } from '../src/index.js';

const broker = process.env.EMARKET_BROKER;
const prefix = process.env.EMARKET_PREFIX ?? 'emarket';
const scratch = process.argv[2] ?? process.env.EMARKET_SCRATCH;
if (!broker || !scratch) {
  console.error('usage: EMARKET_BROKER=host:port EMARKET_PREFIX=p node test/e2e.js SCRATCH_DIR');
  process.exit(2);
}
mkdirSync(scratch, { recursive: true });
const tag = toHex(randomBytes(3));
const { log, warn, warnings, check, step } = steps();

const seller = Party.generate(`nseller-${tag}`, { sealing: false });
const buyer = Party.generate(`nbuyer-${tag}`);
seller.save(join(scratch, `${seller.accountId}.key`));
buyer.save(join(scratch, `${buyer.accountId}.key`));
const opts = { broker, prefix, marketPublicKey: process.env.EMARKET_MARKET_KEY || null, warn, timeoutMs: 30000 };
const S = new MarketClient({ ...opts, party: seller });
const B = new MarketClient({ ...opts, party: buyer });
const stream = `temp-${tag}`;
const hist = `cities-${tag}`;
const names = ['berlin', 'Zürich', '東京', 'nowhere'];
let failed = false;
try {
  await step('connect and read the market key', async () => {
    await S.connect();
    await B.connect();
    check(S.marketPublicKey === B.marketPublicKey, 'one market key');
    if (process.env.EMARKET_MARKET_KEY) check(S.marketPublicKey === process.env.EMARKET_MARKET_KEY, 'the given key');
  });
  await step('open the seller\'s account', async () => {
    const acc = await S.openAccount();
    check(acc.key_id === seller.keyId && acc.version === 1, 'account pins our key at version 1');
  });
  await step('open the buyer\'s account (with a sealing key)', async () => {
    const acc = await B.openAccount();
    check(acc.sealing_key === buyer.sealingKey, 'account pins our sealing key');
  });
  await step('register a stream', async () => {
    const entry = await S.register({ stream_id: stream, mechanism: 'laplace', sensitivity: 1.0, dimension: 2, steps: [0.5, 1.0, 2.0], cap: 4.0, pricing: { kind: 'linear_level', rate_per_level: 100.0 }, description: 'node e2e: Zürich' });
    check(entry.registration.stream_id === stream && entry.market_sealing_key, 'catalog entry with a sealing key');
  });
  await step('register a histogram stream over strings', async () => {
    await S.register({ stream_id: hist, mechanism: 'gaussian', sensitivity: 1.0, dimension: 10, steps: [0.5, 1.0], cap: 2.0, pricing: { kind: 'linear_level', rate_per_level: 100.0 }, product: 'histogram', histogram: { key_space: 'strings' } });
  });
  await step('publish two sealed values', async () => {
    const ans = await S.publish(stream, [{ value_id: 'v1', values: [20.25, -0.0] }, { value_id: 'v2', values: [19.75, 3.5] }]);
    check(ans.outcomes.length === 2 && ans.outcomes.every((o) => o.status === 'accepted'), `accepted: ${JSON.stringify(ans.outcomes)}`);
    check(ans.batch_seq === 0 && ans.next_batch_seq === 1, `the first batch learns where the numbering stands (§6.4.1): ${JSON.stringify(ans)}`);
  });
  await step('values added one by one go out in batches, each answered on its own', async () => {
    const batched = `batched-${tag}`;
    await S.register({ stream_id: batched, mechanism: 'laplace', sensitivity: 1.0, dimension: 2, steps: [0.5, 1.0], cap: 1.0, pricing: { kind: 'linear_level', rate_per_level: 100.0 } });
    const told = [];
    const b = new ValueBatcher(S, batched, { maxValues: 16, maxDelayMs: 60000, onAnswer: (items) => told.push(items.length) });
    const lines = [];
    for (let i = 0; i < 40; i++) lines.push((await b.add({ value_id: `b${i}`, values: i === 39 ? [1, 2, 3] : [i, 1] })).line);
    await b.close(); // sends the last 8 at once, not after the delay
    const got = await Promise.all(lines);
    check(got.slice(0, 39).every((x) => x.status === 'accepted'), `accepted: ${JSON.stringify(got.slice(0, 39))}`);
    check(got[39].status === 'rejected' && got[39].reason === 'wrong_dimension', `the bad value alone refused: ${JSON.stringify(got[39])}`);
    check(JSON.stringify(told) === '[16,16,8]', `batches of 16, 16 and 8: ${told}`);
    const values = await S.reader(S.topic('values'));
    await values.caughtUp(5000);
    const records = values.records.filter((r) => r.key?.toString() === batched).length;
    check(records === 3, `3 records for 40 values, got ${records}`);
    const refused = new ValueBatcher(S, `nosuch-${tag}`, { maxDelayMs: 0 });
    const line = (await refused.add({ values: [1, 2] })).line;
    await refused.close();
    const r = await line;
    check(r.status === 'rejected' && r.reason === 'unknown_stream', `a batch refused whole: each value learns why: ${JSON.stringify(r)}`);
  });
  await step('publish a sealed histogram value', async () => {
    const ans = await S.publish(hist, [{ value_id: 'd1', keys: ['berlin', 'Zu\u0308rich', '東京'], values: [5000, 3000, 4000] }]);
    check(ans.outcomes[0].status === 'accepted', `accepted: ${JSON.stringify(ans.outcomes)}`);
  });
  const q = await step('quote the next step', async () => {
    const ans = await B.quote(stream);
    check(ans.type === 'quote' && ans.level_after === 0.5 && ans.price_minor === 50, `quote: ${JSON.stringify(ans)}`);
    return ans;
  });
  await step('a forged answer in the buyer\'s inbox is skipped, not believed', async () => {
    // Anyone may write to an inbox on this broker: a purchase_fulfilled without the market's
    // signature, and one with a signature header of the wrong length.
    const forged = JSON.stringify({ type: 'purchase_fulfilled', purchase_id: 'forged', buyer_id: buyer.accountId, stream_id: stream, releases: [] });
    await B.producer.send({ topic: B.inbox(), messages: [{ key: 'forged', value: forged }, { key: 'forged', value: forged, headers: { 'emarket-answer': Buffer.alloc(97, 1) } }] });
  });
  await step('a step above the price is refused (price_too_high)', async () => {
    const err = await B.buy(stream, { maxPriceMinor: 1 }).then(() => null, (e) => e);
    check(err instanceof Refused && err.reason === 'price_too_high', `refused: ${err}`);
  });
  await step('a party without an account learns its refusal from <p>.refusals', async () => {
    const stranger = new MarketClient({ ...opts, party: Party.generate(`nobody-${tag}`), marketPublicKey: S.marketPublicKey });
    await stranger.connect();
    try {
      const err = await stranger.quote(stream).then(() => null, (e) => e);
      check(err instanceof Refused && err.reason === 'unknown_account', `refused: ${err}`);
    } finally {
      await stranger.close();
    }
  });
  const bought = [];
  for (const level of [0.5, 1.0]) {
    const reserved = level === 1.0 ? `r-${tag}` : null;
    if (reserved) {
      await step('reserve the step to 1: a signed reservation holds its price (§6.9)', async () => {
        const r = await B.reserve(stream, { holdMs: 60000, reservationId: reserved });
        check(r.type === 'reservation' && r.level_before === 0.5 && r.level_after === 1.0, `reservation: ${JSON.stringify(r)}`);
        check(r.price_minor === q.price_minor && r.expires_at_ms > Date.now() - 60000, `its price and expiry: ${JSON.stringify(r)}`);
      });
    }
    bought.push(await step(`buy the step to ${level}${reserved ? ' on the reservation' : ''}, open it, verify the receipt`, async () => {
      const out = await B.buy(stream, { maxPriceMinor: q.price_minor, ...(reserved ? { reservationId: reserved } : {}) });
      check(out.level_after === level, `level_after ${out.level_after}`);
      check(out.releases.length === 2 && out.releases.every((r) => r.values.length === 2 && r.level === level), 'two releases of two numbers');
      check(out.receipt.receipt_version === 4 && out.receipt.ciphertext_digest, 'a sealed v4 receipt');
      verifyOutcome(out, B.marketPublicKey);
      writeFileSync(join(scratch, `outcome-${level}.json`), JSON.stringify(out, null, 2));
      return out;
    }));
  }
  await step('the second step is gradual: same values, more accurate level', async () => {
    check(bought[1].level_before === 0.5, 'level_before 0.5');
    check(bought[0].receipt.commitment !== bought[1].receipt.commitment, 'new commitment');
  });
  await step('receive a subscription delivery of a new value', async () => {
    const numbered = await S.publish(stream, [{ value_id: 'v3', values: [21.0, 2.0] }]);
    check(numbered.batch_seq === 1, `the next batch is numbered 1: ${JSON.stringify(numbered)}`);
    const msgs = await B.inboxMessages({ ms: 30000, until: (d) => d.type === 'value_released' && d.releases?.some((r) => r.value_id === 'v3') });
    const d = msgs.find((m) => m.type === 'value_released' && m.releases.some((r) => r.value_id === 'v3'));
    check(d, 'a value_released with v3');
    check(d._delivery && d.releases[0].level === 1.0, 'at the level held');
  });
  await step('the seller\'s inbox holds a signed sale of each purchase (§8.4)', async () => {
    // a `sales` notice lists a batch's sales, an earlier market's `sale` is one; each counted
    // once per receipt_sha256, and only from a message signed for this inbox
    const salesIn = (msgs) => {
      const seen = new Map();
      for (const m of msgs.filter((x) => x._delivery && x.seller_id === seller.accountId)) {
        const listed = m.type === 'sales' ? m.sales : m.type === 'sale' ? [m] : [];
        for (const sale of listed) if (sale.stream_id === stream && !seen.has(sale.receipt_sha256)) seen.set(sale.receipt_sha256, sale);
      }
      return [...seen.values()];
    };
    const msgs = await S.inboxMessages({ ms: 30000, until: (d, out) => salesIn(out).length >= 2 });
    const sales = salesIn(msgs);
    check(sales.length === 2, 'two sales, signed for the seller\'s inbox alone');
    const digests = bought.map((o) => toHex(sha256Of(receiptBytes(o.receipt))));
    check(sales.map((m) => m.receipt_sha256).join() === digests.join(), 'each named by its receipt\'s digest');
    check(sales[0].buyer_ref === sales[1].buyer_ref && !JSON.stringify(sales).includes(buyer.accountId), 'one buyer, by a pseudonym');
  });
  await step('buy the histogram stream and name its keys', async () => {
    const out = await B.buy(hist, { maxPriceMinor: 50 });
    check(out.receipt.receipt_version === 5, 'a v5 receipt');
    const known = nameKeys(names);
    const rel = out.releases[0];
    const named = rel.keys.map((k) => known.get(k)).filter(Boolean);
    log(`     released keys ${rel.keys.join(', ')} -> ${named.join(', ')}`);
    check(named.includes('berlin') && named.includes('Zürich') && named.includes('東京'), 'the three big keys are released and named');
    check(rel.keys.includes(stringKey('Zürich')), 'NFC and NFD name one key');
  });
  await step('rotate the buyer\'s keys, then buy at key version 2', async () => {
    const { account } = await B.rotateKeys(Party.generate(buyer.accountId));
    check(account.version === 2 && B.party.keyVersion === 2, 'version 2');
    const out = await B.buy(stream, { maxPriceMinor: 200 });
    check(out.level_after === 2.0 && out.releases.length === 3, `bought ${out.level_after} with ${out.releases.length} releases`);
  });
  await step('a purchase sent again by a new process is answered by its first outcome', async () => {
    const first = await B.buy(stream, { purchaseId: `cap-${tag}`, targetLevel: 4.0, maxPriceMinor: 400 });
    // the id used again with other terms is refused, bound to those bytes (§12.4) ...
    const reused = await B.buy(stream, { purchaseId: `cap-${tag}`, targetLevel: 4.0, maxPriceMinor: 500 }).then(() => null, (e) => e);
    check(reused instanceof Refused && reused.reason === 'idempotency_key_reused', `reuse: ${reused?.message}`);
    // ... and is not the answer to the first purchase sent again: the notice names its own
    const again = await B.buy(stream, { purchaseId: `cap-${tag}`, targetLevel: 4.0, maxPriceMinor: 400 });
    check(again.receipt.signature === first.receipt.signature, 'the same receipt');
  });
  await step('a forged catalog entry with another sealing key is not believed', async () => {
    // Anyone may append to the catalog; only entries the market signed (§12.3) are read.
    const real = await S.catalogEntry(stream);
    const evil = Party.generate('x').sealingKey;
    const forged = { ...real, market_sealing_key: evil };
    await S.producer.send({ topic: S.topic('catalog'), messages: [{ key: stream, value: JSON.stringify(forged) }] });
    const fresh = new MarketClient({ ...opts, party: seller, marketPublicKey: S.marketPublicKey });
    await fresh.connect();
    try {
      const entry = await fresh.catalogEntry(stream);
      check(entry.market_sealing_key === real.market_sealing_key, 'the market\'s sealing key, not the forgery\'s');
      await fresh.checkSealingKey(entry.market_sealing_key); // what publish checks before it seals
    } finally {
      await fresh.close();
    }
  });
  writeFileSync(join(scratch, 'e2e.json'), JSON.stringify({ seller: seller.accountId, buyer: buyer.accountId, stream, histogram: hist, market_public_key: S.marketPublicKey }, null, 2));
  const trusted = warnings.filter((w) => w.startsWith('trusting the market key'));
  const skipped = warnings.filter((w) => !trusted.includes(w));
  check(trusted.length === (process.env.EMARKET_MARKET_KEY ? 0 : 2) && trusted.every((w) => w.includes(S.marketPublicKey)), `a key trusted on first use is named: ${trusted.join('; ')}`);
  check(skipped.length === 2 && skipped.every((w) => w.includes('not signed by the market')), `only the forged messages were skipped: ${skipped.join('; ')}`);
  log('all steps passed');
} catch (err) {
  failed = true;
  console.error(`e2e failed: ${err.message}`);
} finally {
  await S.close();
  await B.close();
}
process.exit(failed ? 1 : 0);
