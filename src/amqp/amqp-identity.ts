import type { ConsumeMessage } from 'amqplib';
import { ValidationError } from '../errors.js';
import { identityFromWireContract, type JobIdentity } from '../consumer/wire-contract.js';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem, printable } from '../json-limits.js';
import { assertValidKeyPart } from '../protocol/validate.js';

/**
 * Where an AMQP message's idempotency key comes from.
 *
 * - `{ source: 'body' }` (default): the body is the wire contract as JSON,
 *   `{ "idempotencyKey": "order-42", "scope": "payments", "payload": {…} }`; the handler
 *   receives `payload`.
 * - `{ source: 'header', scope }`: for foreign publishers. The key is the `Idempotency-Key`
 *   header (or `header`), the scope is fixed per consumer, and the whole body, parsed as JSON,
 *   is the payload.
 * - `{ source: 'message-id', scope }`: the key is the AMQP `message-id` property; as above.
 *
 * The fingerprint covers the message's `type` property (its "name", empty when unset) and the
 * payload: the same key with another body is refused as reused.
 */
export type AmqpIdentityOptions =
  | {
      /** The body is the wire contract as JSON. */
      readonly source: 'body';
    }
  | {
      /** The key is a header; the whole body is the payload. */
      readonly source: 'header';
      /** The scope of every key this consumer reads. */
      readonly scope: string;
      /** The header holding the key. @defaultValue `'Idempotency-Key'` */
      readonly header?: string;
    }
  | {
      /** The key is the AMQP `message-id` property; the whole body is the payload. */
      readonly source: 'message-id';
      /** The scope of every key this consumer reads. */
      readonly scope: string;
    };

/** Reads a message's identity as `options` say; throws a {@link ValidationError} saying what is wrong. */
export function amqpIdentityReader<P>(options: AmqpIdentityOptions = { source: 'body' }): (message: ConsumeMessage) => JobIdentity<P> {
  if (options.source !== 'body') assertValidKeyPart('scope', options.scope);
  return (message) => {
    const name = typeof message.properties.type === 'string' ? message.properties.type : '';
    const body = parseBody(message);
    if (options.source === 'body') return identityFromWireContract({ name, data: body }) as JobIdentity<P>;
    const key = options.source === 'header' ? headerValue(message, options.header ?? 'Idempotency-Key') : message.properties.messageId;
    const field = options.source === 'header' ? `header "${options.header ?? 'Idempotency-Key'}"` : 'message-id property';
    if (typeof key !== 'string' || key.length === 0) {
      throw new ValidationError('INVALID_KEY', field, `The message has no idempotency key: the ${field} is missing or not a string.`);
    }
    assertValidKeyPart('key', key);
    const found = findJsonProblem(key, { maxDepth: 0, allowNul: false }) ?? findJsonProblem(body, { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: true });
    if (found) {
      throw new ValidationError('INVALID_JOB_DATA', field, `The message (scope "${options.scope}", key "${printable(key)}") cannot be stored: ${describeJsonProblem(found)}.`);
    }
    return { scope: options.scope, key, payload: body as P, fingerprintOf: { name, payload: body } };
  };
}

/** Header lookup, case-insensitive (HTTP-style names reach AMQP in any case). */
function headerValue(message: ConsumeMessage, name: string): unknown {
  const headers = message.properties.headers ?? {};
  if (name in headers) return headers[name];
  const lower = name.toLowerCase();
  const found = Object.keys(headers).find((each) => each.toLowerCase() === lower);
  return found === undefined ? undefined : headers[found];
}

function parseBody(message: ConsumeMessage): unknown {
  const text = message.content.toString('utf8');
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new ValidationError(
      'INVALID_JOB_DATA',
      'body',
      `The message body is not JSON (${(error as Error).message}); publish the wire contract ` +
        '{ idempotencyKey, scope?, payload } or a JSON body with an Idempotency-Key header.',
    );
  }
}
