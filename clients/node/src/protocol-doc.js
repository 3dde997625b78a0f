// Reading the JSON vector blocks embedded in docs/protocol.md (for tests and auditors).
import { readFileSync } from 'node:fs';

/** The JSON block between `<!-- NAME: begin -->` and `<!-- NAME: end -->`, or after a marker. */
export function embeddedJson(path, begin, end) {
  const text = readFileSync(path, 'utf8');
  const a = text.indexOf(begin);
  if (a < 0) throw new Error(`${begin} not in ${path}`);
  const rest = end ? text.slice(a, text.indexOf(end, a)) : text.slice(a);
  const m = /```json\n([\s\S]*?)\n```/.exec(rest);
  if (!m) throw new Error(`no JSON block after ${begin}`);
  return JSON.parse(m[1]);
}
