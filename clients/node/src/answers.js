// Answers the market signs and the refusal record (docs/protocol.md §12).
import { ed25519 } from '@noble/curves/ed25519';
import { Items, concat, utf8, toHex, fromB64, sha256Of } from './bytes.js';

export const ANSWER_HEADER = 'emarket-answer';

/** `M` of §12.2; `requestSha256` (32 bytes or hex) is null for a delivery. */
export function answerBytes({ prefix, topic, requestSha256, value }) {
  const it = new Items(concat(utf8('emarket-sig-v1'), Uint8Array.of(0))).s(prefix).s('answer').s(topic);
  if (requestSha256 == null) it.n();
  else it.s(typeof requestSha256 === 'string' ? requestSha256 : toHex(requestSha256));
  it.s(toHex(sha256Of(typeof value === 'string' ? utf8(value) : value)));
  return it.bytes();
}

function headerValues(headers) {
  // kafkajs gives headers as {name: Buffer | Buffer[]}; a list of [name, value] pairs is accepted too.
  const out = [];
  if (Array.isArray(headers)) {
    for (const [k, v] of headers) if (k === ANSWER_HEADER) out.push(v);
  } else if (headers) {
    const v = headers[ANSWER_HEADER];
    if (Array.isArray(v)) out.push(...v);
    else if (v !== undefined) out.push(v);
  }
  return out.map((v) => (typeof v === 'string' ? Buffer.from(v, 'binary') : v));
}

/**
 * Check the `emarket-answer` header of a message read from `topic` (§12.3). Returns
 * `{ok: true, request: hex | null}` (request: the R the answer is bound to, null for a
 * delivery), or `{ok: false, why}`.
 */
export function verifyAnswer({ prefix, topic, value, headers, marketPublicKey }) {
  const hs = headerValues(headers);
  if (hs.length !== 1) return { ok: false, why: `${hs.length} ${ANSWER_HEADER} headers` };
  const h = new Uint8Array(hs[0]);
  if ((h.length !== 65 && h.length !== 97) || h[0] !== 1) return { ok: false, why: `a ${h.length}-byte ${ANSWER_HEADER} header` };
  const request = h.length === 97 ? toHex(h.subarray(65)) : null;
  const m = answerBytes({ prefix, topic, requestSha256: request, value: value ?? new Uint8Array() });
  const pk = typeof marketPublicKey === 'string' ? fromB64(marketPublicKey) : marketPublicKey;
  let good = false;
  try {
    good = ed25519.verify(h.subarray(1, 65), m, pk, { zip215: false });
  } catch {
    good = false;
  }
  return good ? { ok: true, request } : { ok: false, why: 'the signature does not verify under the market key' };
}

/** `hex(R)`, the SHA-256 of the exact bytes sent: the key of a refusal record (§12.5). */
export const requestDigest = (bytes) => toHex(sha256Of(bytes));

/**
 * The earlier answer an `already_answered` notice stands for (§12.4's resend rule), among
 * `earlier`: the market's answers to that purchase id and stream in the inbox, oldest first, as
 * `{doc, valueSha256}`. The `purchase_fulfilled` whose value has `details.answer_sha256`, or the
 * rejection with code `details.answer_reason`; from a market that names neither, the newest
 * answer that is not the refusal of another request that used the id. Newest first; undefined
 * if none.
 */
export function namedAnswer(notice, earlier) {
  const named = notice?.details?.answer_sha256;
  const code = notice?.details?.answer_reason;
  for (const { doc, valueSha256 } of [...earlier].reverse()) {
    const ok = typeof named === 'string'
      ? valueSha256 === named
      : typeof code === 'string'
        ? doc.type === 'rejection' && doc.reason === code
        : !(doc.type === 'rejection' && doc.reason === 'idempotency_key_reused');
    if (ok) return doc;
  }
  return undefined;
}
