// epsilon-market-client: the public API (docs/protocol.md is the normative spec).
export { Items, utf8, toHex, fromHex, toB64, fromB64, sha256Of, concat } from './bytes.js';
export { canonicalBytes, marketRef, signEvent, signBytes, validSigningKey, verifyBytes, verifyEvent, EVENT_TYPES } from './signing.js';
export { keyId, decodePublicKey, Party, KeyFileError, KEY_FILE_VERSION, exposure } from './keys.js';
export { ALG, valuesAad, envelopeKey, seal, open, valuesPlaintext, sealBatch, releaseAad, openReleases } from './sealing.js';
export { receiptBytes, releasesDigest, commitment, verifyReceipt, verifyOutcome, ReceiptInvalid } from './receipts.js';
export { answerBytes, verifyAnswer, requestDigest, namedAnswer, ANSWER_HEADER } from './answers.js';
export { stringKey, nameKeys, STRING_KEY_LABEL } from './histogram.js';
export { murmur2, partitionOf } from './partition.js';
export { stateKeys, stateStamp, stateAad, openState, entryDigest } from './state.js';
export { encodeIdentity } from './identity.js';
export { workBytes, solveWork, leadingZeroBits, DEFAULT_WORK_BITS } from './work.js';
export { MarketClient, Refused, TimedOut } from './kafka.js';
export { ValueBatcher, DEFAULT_MAX_VALUES, DEFAULT_MAX_DELAY_MS, MAX_IN_FLIGHT, MAX_BATCH } from './batching.js';
export { InboxOpener } from './opening.js';
export { MarketRootError, readRoot, trustedKey, rootVerdict, inboxMode } from './root.js';
export { inboxRoute, routeFrom, inboxSignedBytes, parseSignedBytes, paddedLength, sealInboxRecord, openInboxRecord, InboxRecordError, INBOX_V2_HEAD } from './inbox_v2.js';
export { TopicInbox, SharedInbox } from './inbox.js';
