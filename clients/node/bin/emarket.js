#!/usr/bin/env node
// emarket: a command-line client of the epsilon-market protocol (see ../README.md).
// Exit codes: 0 the market accepted the request, 1 refused (or a receipt does not verify),
// 2 bad input, 3 no answer in time, 4 broker unreachable.
import { parseArgs } from 'node:util';
import { readFileSync, writeFileSync } from 'node:fs';
import { MarketClient, MarketRootError, Party, Refused, TimedOut, ReceiptInvalid, verifyOutcome, verifyReceipt, nameKeys, decodePublicKey, InboxOpener, ValueBatcher, DEFAULT_MAX_VALUES, DEFAULT_MAX_DELAY_MS, MAX_BATCH } from '../src/index.js';

const USAGE = `usage: emarket [global options] COMMAND [options]

global options (or their environment variables):
  --broker HOST:PORT   EMARKET_BROKER            --prefix P    EMARKET_PREFIX (default emarket)
  --market-key B64     EMARKET_MARKET_KEY: the key to pin (else the one <prefix>.market names, trusted
                       on first use with a warning)
  --key-file PATH      EMARKET_KEY_FILE          --json        machine-readable output
  --timeout SECONDS    how long to wait for an answer (default 30)

commands:
  keygen --account ID --out PATH [--no-sealing]
  account open [--invitation FILE]   FILE: the operators' invitation (invite-only markets)
  account rotate --out NEW_KEY_FILE [--no-sealing]   new keys, signed by the old and the new
  register --stream ID --steps 0.5,1,2 --cap 4 (--price-per-level R | --prices 0.5=10,1=20)
           [--mechanism laplace] [--sensitivity 1] [--dimension 1] [--retain-last N]
           [--currency EUR] [--description TEXT] [--histogram strings|integers [--domain-size N]]
  publish --stream ID (--values 1,2,3 [--value-id ID] | --file values.jsonl) [--clear]
          [--batch-size N] [--batch-delay SECONDS]   values per signed batch, at most (default
                                  ${DEFAULT_MAX_VALUES}), and the longest a value waits for others (default ${DEFAULT_MAX_DELAY_MS / 1000})
  quote --stream ID [--target LEVEL]
  reserve --stream ID --hold SECONDS [--target LEVEL] [--reservation-id ID]
                                  hold the price and privacy room of a purchase (1 to 120 s)
  buy --stream ID --max-price MINOR [--target LEVEL | --rmse X | --half-width X [--confidence C]
      | --most-accurate | --reservation ID] [--purchase-id ID] [--output PATH] [--key-names names.txt]
  tail [--wait SECONDS] [--old-key-file OLD.key ...]
                                  every message of your inbox the market signed, opened with the
                                  key file's current and retired sealing keys (and OLD.key's)
  verify-receipt FILE [--public-key B64]`;

class BadInput extends Error {}

const OPTIONS = {
  broker: { type: 'string' }, prefix: { type: 'string' }, 'market-key': { type: 'string' }, 'key-file': { type: 'string' },
  json: { type: 'boolean' }, timeout: { type: 'string' }, help: { type: 'boolean', short: 'h' },
  account: { type: 'string' }, out: { type: 'string' }, 'no-sealing': { type: 'boolean' }, invitation: { type: 'string' },
  stream: { type: 'string' }, steps: { type: 'string' }, cap: { type: 'string' }, 'price-per-level': { type: 'string' },
  prices: { type: 'string' }, mechanism: { type: 'string' }, sensitivity: { type: 'string' }, dimension: { type: 'string' },
  'retain-last': { type: 'string' }, currency: { type: 'string' }, description: { type: 'string' }, histogram: { type: 'string' },
  'domain-size': { type: 'string' }, values: { type: 'string' }, 'value-id': { type: 'string' }, file: { type: 'string' },
  clear: { type: 'boolean' }, target: { type: 'string' }, 'max-price': { type: 'string' }, rmse: { type: 'string' },
  'half-width': { type: 'string' }, confidence: { type: 'string' }, 'most-accurate': { type: 'boolean' },
  'purchase-id': { type: 'string' }, output: { type: 'string' }, 'key-names': { type: 'string' }, wait: { type: 'string' },
  'public-key': { type: 'string' }, 'old-key-file': { type: 'string', multiple: true },
  'batch-size': { type: 'string' }, 'batch-delay': { type: 'string' },
  hold: { type: 'string' }, reservation: { type: 'string' }, 'reservation-id': { type: 'string' },
};

function num(text, what) {
  const x = Number(text);
  if (text === undefined || text === '' || !Number.isFinite(x)) throw new BadInput(`--${what} must be a number, got ${text}`);
  return x;
}

const int = (text, what) => {
  const x = num(text, what);
  if (!Number.isSafeInteger(x)) throw new BadInput(`--${what} must be a whole number`);
  return x;
};

const need = (o, k) => {
  if (o[k] === undefined) throw new BadInput(`--${k} is required`);
  return o[k];
};

function party(o) {
  const path = o['key-file'] ?? process.env.EMARKET_KEY_FILE;
  if (!path) throw new BadInput('--key-file (or EMARKET_KEY_FILE) is required');
  try {
    return Party.load(path);
  } catch (err) {
    throw new BadInput(`${path}: ${err.message}`);
  }
}

function client(o, p) {
  const broker = o.broker ?? process.env.EMARKET_BROKER;
  if (!broker) throw new BadInput('--broker (or EMARKET_BROKER) is required');
  const pinned = o['market-key'] ?? process.env.EMARKET_MARKET_KEY ?? null;
  if (pinned) {
    try {
      decodePublicKey(pinned);
    } catch (err) {
      throw new BadInput(`--market-key (EMARKET_MARKET_KEY): ${err.message}`);
    }
  }
  return new MarketClient({
    broker, prefix: o.prefix ?? process.env.EMARKET_PREFIX ?? 'emarket', party: p,
    marketPublicKey: pinned,
    timeoutMs: 1000 * num(o.timeout ?? '30', 'timeout'),
  });
}

async function withClient(o, p, fn) {
  const c = client(o, p);
  try {
    await c.connect();
  } catch (err) {
    await c.close(); // its readers would keep the process alive
    if (err instanceof TimedOut || err instanceof MarketRootError) throw err;
    const e = new Error(`cannot reach the market: ${err.message}`);
    e.exitCode = 4;
    throw e;
  }
  try {
    return await fn(c);
  } finally {
    await c.close();
  }
}

function emit(o, doc, human) {
  if (o.json) console.log(JSON.stringify(doc));
  else console.log(human);
}

function registration(o) {
  const steps = need(o, 'steps').split(',').map((s) => num(s, 'steps'));
  let pricing;
  if (o.prices) {
    pricing = { kind: 'table', prices: Object.fromEntries(o.prices.split(',').map((kv) => { const [k, v] = kv.split('='); return [k, int(v, 'prices')]; })) };
  } else {
    pricing = { kind: 'linear_level', rate_per_level: num(need(o, 'price-per-level'), 'price-per-level') };
  }
  const r = {
    stream_id: need(o, 'stream'), mechanism: o.mechanism ?? (o.histogram ? 'gaussian' : 'laplace'), sensitivity: num(o.sensitivity ?? '1', 'sensitivity'),
    dimension: int(o.dimension ?? '1', 'dimension'), steps, cap: num(o.cap ?? String(steps[steps.length - 1]), 'cap'), pricing,
  };
  if (o['retain-last']) r.retain_last = int(o['retain-last'], 'retain-last');
  if (o.currency) r.currency = o.currency;
  if (o.description) r.description = o.description;
  if (o.histogram) {
    r.product = 'histogram';
    r.histogram = { key_space: o.histogram };
    if (o['domain-size']) r.histogram.domain_size = int(o['domain-size'], 'domain-size');
  }
  return r;
}

function items(o) {
  if (o.file) {
    return readFileSync(o.file, 'utf8').split('\n').filter((l) => l.trim()).map((l, k) => {
      const d = JSON.parse(l);
      return { value_id: d.value_id ?? `v-${Date.now()}-${k}`, values: d.values, ...(d.keys ? { keys: d.keys } : {}), ...(d.published_at_ms ? { published_at_ms: d.published_at_ms } : {}) };
    });
  }
  return [{ value_id: o['value-id'] ?? `v-${Date.now()}`, values: need(o, 'values').split(',').map((s) => num(s, 'values')) }];
}

/** `--batch-size` and `--batch-delay` (seconds) as a ValueBatcher's options, checked. */
function batchOptions(o) {
  const size = o['batch-size'] === undefined ? DEFAULT_MAX_VALUES : Number(o['batch-size']);
  if (!Number.isInteger(size) || size < 1 || size > MAX_BATCH) throw new BadInput(`--batch-size takes 1 to ${MAX_BATCH} values, got ${o['batch-size']}`);
  const delay = o['batch-delay'] === undefined ? DEFAULT_MAX_DELAY_MS / 1000 : Number(o['batch-delay']);
  if (o['batch-delay'] === '' || !(delay >= 0) || !Number.isFinite(delay)) throw new BadInput(`--batch-delay takes seconds, 0 or more, got ${o['batch-delay']}`);
  return { maxValues: size, maxDelayMs: delay * 1000 };
}

function accuracy(o) {
  if (o.rmse) return { rmse: num(o.rmse, 'rmse') };
  if (o['half-width']) return { half_width: num(o['half-width'], 'half-width'), ...(o.confidence ? { confidence: num(o.confidence, 'confidence') } : {}) };
  return null;
}

const fmtRelease = (r, names) => `  ${r.value_id} (seq ${r.seq}) at ${r.level}: ${r.values.map((x, j) => (r.keys ? `${names?.get(r.keys[j]) ?? r.keys[j]}=${x}` : x)).join(', ')}`;

const COMMANDS = {
  async keygen(o) {
    const p = Party.generate(need(o, 'account'), { sealing: !o['no-sealing'] });
    p.save(need(o, 'out'));
    emit(o, { account_id: p.accountId, key_id: p.keyId, signing_key: p.signingKey, sealing_key: p.sealingKey, file: o.out }, `wrote ${o.out}: account ${p.accountId}, key id ${p.keyId}`);
  },
  async account(o, args) {
    if (args[0] === 'rotate') {
      const p = party(o);
      const out = need(o, 'out');
      const next = Party.generate(p.accountId, { sealing: !o['no-sealing'] });
      const { account } = await withClient(o, p, (c) => c.rotateKeys(next));
      next.save(out);
      emit(o, account, `account ${account.account_id} rotated to version ${account.version} (key ${account.key_id}); new key file ${out}`);
      return;
    }
    if (args[0] !== 'open') throw new BadInput('usage: emarket account open | account rotate --out NEW_KEY_FILE');
    const p = party(o);
    const invitation = o.invitation ? JSON.parse(readFileSync(o.invitation, 'utf8')) : undefined;
    let where;
    const acc = await withClient(o, p, async (c) => {
      const got = await c.openAccount({ invitation });
      where = c.inboxWhere(); // the inbox, as the market's identity lays it out (§8.5)
      return got;
    });
    emit(o, acc, `account ${acc.account_id} is open (key ${acc.key_id}, version ${acc.version}); its inbox is ${where}`);
  },
  async register(o) {
    const p = party(o);
    const entry = await withClient(o, p, (c) => c.register(registration(o)));
    emit(o, entry, `stream ${entry.registration.stream_id} registered; levels for sale: ${entry.prices.map((x) => `${x.level} (${x.price_minor} ${entry.registration.currency ?? 'EUR'} minor)`).join(', ')}`);
  },
  async publish(o) {
    const batching = batchOptions(o);
    const p = party(o);
    const stream = need(o, 'stream');
    const rows = items(o);
    const outcomes = await withClient(o, p, async (c) => {
      const b = new ValueBatcher(c, stream, { ...batching, clear: !!o.clear });
      const lines = [];
      for (const it of rows) lines.push((await b.add(it)).line);
      await b.close();
      return Promise.all(lines);
    });
    const ans = { type: 'values_accepted', stream_id: stream, seller_id: p.accountId, outcomes };
    const bad = ans.outcomes.filter((x) => x.status === 'rejected');
    emit(o, ans, ans.outcomes.map((x) => `${x.value_id}: ${x.status}${x.reason ? ` (${x.reason}: ${x.message})` : ''}`).join('\n'));
    if (bad.length) throw new Refused(bad[0].reason, bad[0].message, ans);
  },
  async quote(o) {
    const p = party(o);
    const ans = await withClient(o, p, (c) => c.quote(need(o, 'stream'), { targetLevel: o.target ? num(o.target, 'target') : null }));
    const offers = (ans.offers ?? []).map((x) => `  ${String(x.level).padEnd(8)} rmse ${x.rmse.toPrecision(4).padStart(10)}  ${x.held ? 'held' : `${x.price_minor} minor`}`).join('\n');
    emit(o, ans, `next step: ${ans.level_before} -> ${ans.level_after} (${ans.level_unit}) for ${ans.price_minor} ${ans.currency} minor\n${offers}`);
  },
  async reserve(o) {
    const p = party(o);
    const seconds = num(need(o, 'hold'), 'hold');
    if (!(seconds >= 1 && seconds <= 120)) throw new BadInput(`--hold is how many seconds to hold the terms, 1 to 120, not ${o.hold}`);
    const ans = await withClient(o, p, (c) => c.reserve(need(o, 'stream'), {
      holdMs: Math.round(seconds * 1000), targetLevel: o.target ? num(o.target, 'target') : null,
      ...(o['reservation-id'] ? { reservationId: o['reservation-id'] } : {}),
    }));
    const room = (ans.held ?? []).map((h) => `  room held in the window from ${new Date(h.start_ms).toISOString()}: ${h.room} ${ans.level_unit}`).join('\n');
    emit(o, ans, `reserved ${ans.reservation_id} on ${ans.stream_id}: ${ans.level_before} -> ${ans.level_after} (${ans.level_unit}) for ${ans.price_minor} ${ans.currency} minor until ${new Date(ans.expires_at_ms).toISOString()}${room ? `\n${room}` : ''}\nbuy it: emarket buy --stream ${ans.stream_id} --reservation ${ans.reservation_id} --max-price ${ans.price_minor}`);
  },
  async buy(o) {
    const p = party(o);
    if (o.reservation && (o.rmse || o['half-width'] || o['most-accurate'])) {
      throw new BadInput('--reservation buys the level the reservation holds: give it without --rmse, --half-width or --most-accurate');
    }
    const names = o['key-names'] ? nameKeys(readFileSync(o['key-names'], 'utf8').split('\n').filter(Boolean)) : null;
    const out = await withClient(o, p, (c) => c.buy(need(o, 'stream'), {
      maxPriceMinor: int(need(o, 'max-price'), 'max-price'), targetLevel: o.target ? num(o.target, 'target') : null,
      accuracy: accuracy(o), mostAccurate: !!o['most-accurate'], ...(o['purchase-id'] ? { purchaseId: o['purchase-id'] } : {}), ...(o.currency ? { currency: o.currency } : {}),
      ...(o.reservation ? { reservationId: o.reservation } : {}),
    }));
    if (o.output) writeFileSync(o.output, JSON.stringify(out, null, 2) + '\n');
    emit(o, out, `bought ${out.stream_id} ${out.level_before} -> ${out.level_after} for ${out.price_minor} ${out.currency} minor (receipt verified)\n${out.releases.map((r) => fmtRelease(r, names)).join('\n')}`);
  },
  async tail(o) {
    let p = party(o);
    try {
      p = p.holding((o['old-key-file'] ?? []).map((f) => Party.load(f)));
    } catch (err) {
      throw new BadInput(`--old-key-file: ${err.message}`);
    }
    const msgs = await withClient(o, p, (c) => c.inboxMessages({ ms: 1000 * num(o.wait ?? '2', 'wait') }));
    const fix = (u) => (u.keyVersion && !u.held ? `: pass the key file of version ${u.keyVersion} with --old-key-file FILE` : '');
    if (o.json) for (const m of msgs) console.log(JSON.stringify(m));
    else {
      for (const m of msgs) {
        console.log(`${m._offset} ${m.type}${m.stream_id ? ` ${m.stream_id}` : ''}${m.reason ? ` ${m.reason}: ${m.message}` : ''}${m.releases ? `\n${m.releases.map((r) => fmtRelease(r)).join('\n')}` : ''}`);
        if (m._unopened) console.log(`  not opened: ${m._unopened.reason}${fix(m._unopened)}`);
      }
    }
    const closed = msgs.filter((m) => m._unopened);
    if (closed.length) console.error(`warning: ${closed.length} sealed message(s) could not be opened${o.json ? ' (their _unopened says why)' : ' (above)'}`);
  },
  async 'verify-receipt'(o, args) {
    const file = args[0] ?? need(o, 'file');
    let doc = JSON.parse(readFileSync(file, 'utf8'));
    let key = o['public-key'] ?? o['market-key'] ?? process.env.EMARKET_MARKET_KEY;
    if (!key) key = await withClient(o, null, async (c) => c.marketPublicKey);
    if (doc.receipt_version !== undefined) {
      verifyReceipt(doc, key);
      emit(o, { valid: true, receipt: doc }, `receipt ${doc.purchase_id}: signature valid (no releases to check)`);
      return;
    }
    const sealedCiphertext = doc.sealed?.ciphertext;
    if (doc.sealed && !doc.opening) {
      const got = new InboxOpener(party(o).sealingKeys()).open(doc); // a retired key opens what was sealed before a rotation
      if (got.unopened) throw new BadInput(`${file}: ${got.unopened.reason}`);
      doc = got.doc;
    }
    verifyOutcome(doc, key, { sealedCiphertext });
    emit(o, { valid: true, receipt: doc.receipt }, `receipt ${doc.receipt.purchase_id}: signature valid, ${doc.releases.length} releases open its commitment`);
  },
};

async function main() {
  let parsed;
  try {
    parsed = parseArgs({ options: OPTIONS, allowPositionals: true, strict: true });
  } catch (err) {
    console.error(`${err.message}\n${USAGE}`);
    return 2;
  }
  const o = parsed.values;
  const [cmd, ...args] = parsed.positionals;
  if (o.help || !cmd) {
    console.log(USAGE);
    return cmd || o.help ? 0 : 2;
  }
  if (!COMMANDS[cmd]) {
    console.error(`unknown command ${cmd}\n${USAGE}`);
    return 2;
  }
  try {
    await COMMANDS[cmd](o, args);
    return 0;
  } catch (err) {
    const fail = (code, reason, message) => {
      if (o.json) console.log(JSON.stringify({ error: reason, message }));
      console.error(`${reason}: ${message}`);
      return code;
    };
    if (err instanceof Refused) return fail(1, err.reason, err.detail);
    if (err instanceof ReceiptInvalid) return fail(1, 'receipt_invalid', err.message);
    if (err instanceof MarketRootError) return fail(1, `market_root_${err.reason}`, err.message);
    if (err instanceof BadInput) return fail(2, 'bad_input', err.message);
    if (err instanceof TimedOut) return fail(3, 'timeout', err.message);
    if (err.exitCode === 4) return fail(4, 'unreachable', err.message);
    return fail(2, 'error', err.message);
  }
}

process.exitCode = await main();
