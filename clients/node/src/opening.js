// Opening the sealed releases of one inbox, read in order, with every sealing key a party holds
// (docs/protocol.md §4.6, §5.2). After a rotation the records before it stay sealed to the old
// key; the inbox's `account` messages say which key version the account was at, so a record no
// key opens is named with the version whose key file would open it. Nothing here throws for a
// record that does not open: the rest of the inbox is still read.
import { openReleases } from './sealing.js';

export class InboxOpener {
  /** `keys`: `{keyVersion, sealingPrivate, sealingKey}` (Party#sealingKeys()). */
  constructor(keys) {
    this.keys = keys;
    this.state = null;
  }

  /**
   * `{doc}` with its releases opened, or `{doc, unopened}` (the message as it came and why it
   * stays closed: `{reason, keyVersion, keyId, held}`); an `account` message updates the keys followed.
   */
  open(doc) {
    if (doc.type === 'account') this.state = doc;
    if (!doc.sealed || (doc.type !== 'purchase_fulfilled' && doc.type !== 'value_released')) return { doc };
    const now = this.state?.sealing_key ?? null;
    const keys = [...this.keys].sort((a, b) => (a.sealingKey === now ? 0 : 1) - (b.sealingKey === now ? 0 : 1));
    for (const k of keys) {
      try {
        return { doc: openReleases(doc, k.sealingPrivate), key: k };
      } catch {
        // another key may open it
      }
    }
    return { doc, unopened: this.why() };
  }

  why() {
    const st = this.state;
    const held = !!st && this.keys.some((k) => k.sealingKey === st.sealing_key);
    const what = 'its releases are sealed';
    let reason;
    if (!this.keys.length) reason = `${what}, and the key files given hold no sealing key (keygen --no-sealing)`;
    else if (!st) reason = `${what} to a key none of the key files given holds`;
    else if (!held) reason = `${what} to the account's keys of version ${st.version} (key id ${st.key_id}), which none of the key files given holds`;
    else {
      const versions = this.keys.map((k) => k.keyVersion).sort((a, b) => a - b).join(', ');
      reason = `${what}, and open with none of the sealing keys given (versions ${versions}), though the account was at version ${st.version}: sealed to another version's key in the moment of a rotation, or altered`;
    }
    return { reason, keyVersion: st?.version ?? null, keyId: st?.key_id ?? null, held };
  }
}
