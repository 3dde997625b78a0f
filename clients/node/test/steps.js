// The scaffolding of the end-to-end scripts: named steps, checks, and the warnings a client gave.

/** `{log, warn, warnings, check, step}`: warnings are kept (and printed) for the final checks. */
export function steps() {
  const log = (m) => console.log(`e2e: ${m}`);
  const warnings = [];
  const warn = (m) => {
    warnings.push(m);
    console.error(`warning: ${m}`);
  };
  const check = (cond, what) => {
    if (!cond) throw new Error(`check failed: ${what}`);
  };
  const step = async (name, fn) => {
    const t = Date.now();
    try {
      const out = await fn();
      log(`ok   ${name} (${Date.now() - t} ms)`);
      return out;
    } catch (err) {
      log(`FAIL ${name}: ${err.stack ?? err}`);
      throw err;
    }
  };
  return { log, warn, warnings, check, step };
}
