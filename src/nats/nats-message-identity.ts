import type { JsMsg } from '@nats-io/jetstream';
import { ValidationError } from '../errors.js';
import { identityFromWireContract, type JobIdentity } from '../consumer/wire-contract.js';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem, printable } from '../json-limits.js';
import { DEFAULT_SCOPE, assertValidKeyPart } from '../protocol/validate.js';

/** The header JetStream reads for its own publish deduplication, and that a foreign publisher can set as the key. */
export const NATS_MSG_ID_HEADER = 'Nats-Msg-Id';

/**
 * Where a message's idempotency key comes from:
 * - `'wire-contract'`: the body is the wire contract's JSON
 *   (`{ "idempotencyKey", "scope"?, "payload" }`, see the wire contract in docs/guide.md), scope and key read from it;
 * - `'nats-msg-id'`: the key is the `Nats-Msg-Id` header, the scope is the consumer's `scope`
 *   option, and the whole body, as JSON, is the payload. For publishers that already set
 *   `Nats-Msg-Id` for JetStream's publish deduplication: the same id then also guards the
 *   effect after JetStream's dedup window (2 minutes by default) has passed.
 */
export type NatsKeySource = 'wire-contract' | 'nats-msg-id';

/** The parts of a JetStream message that identify it (a `JsMsg` has them). */
export type NatsMessageLike = Pick<JsMsg, 'subject' | 'data' | 'headers'>;

/**
 * Reads a message's identity. The fingerprint covers the subject and the payload, as a BullMQ
 * job's covers its name and payload: the same key published on another subject, or with
 * another payload, is refused as reused. Throws a {@link ValidationError} saying what is wrong.
 */
export function identityFromNatsMessage(message: NatsMessageLike, source: NatsKeySource, scope: string = DEFAULT_SCOPE): JobIdentity {
  if (source === 'wire-contract') {
    return identityFromWireContract({ name: message.subject, data: parseBody(message, 'wire contract') });
  }
  const key = message.headers?.get(NATS_MSG_ID_HEADER) ?? '';
  if (key === '') {
    throw new ValidationError(
      'INVALID_JOB_DATA',
      NATS_MSG_ID_HEADER,
      `Message on "${message.subject}" has no ${NATS_MSG_ID_HEADER} header, which this consumer reads its idempotency key from ` +
        '(keyFrom: "nats-msg-id"). Publish with a message id, or use the wire contract (keyFrom: "wire-contract").',
    );
  }
  assertValidKeyPart('key', key);
  assertValidKeyPart('scope', scope);
  const payload = parseBody(message, `${NATS_MSG_ID_HEADER} "${printable(key)}"`);
  const found = findJsonProblem(payload, { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: true });
  if (found) {
    throw new ValidationError('INVALID_JOB_DATA', `body${found.pointer}`, `Message body ${describeJsonProblem(found)} (scope "${scope}", key "${printable(key)}").`);
  }
  return { scope, key, payload, fingerprintOf: { name: message.subject, payload } };
}

function parseBody(message: NatsMessageLike, what: string): unknown {
  try {
    return JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(message.data));
  } catch (error) {
    throw new ValidationError(
      'INVALID_JOB_DATA',
      'body',
      `Message on "${message.subject}" (${what}) is not UTF-8 JSON: ${(error as Error).message}. ` +
        'The consumer reads JSON bodies (see "NATS JetStream" in docs/brokers.md).',
    );
  }
}
