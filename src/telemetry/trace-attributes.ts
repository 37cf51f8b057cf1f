import { createHash } from 'node:crypto';
import type { Attributes } from './otel-api.js';

/** Attribute names on the library's spans. */
export const ATTR = {
  queue: 'idempotent_jobs.queue',
  scope: 'idempotent_jobs.scope',
  /** The key itself: only with `recordKeys` (keys can carry personal data). */
  key: 'idempotent_jobs.key',
  /** Otherwise its hash: the BullMQ job id of the key without its `ij_` prefix. */
  keyHash: 'idempotent_jobs.key_hash',
  fence: 'idempotent_jobs.fence',
  outcome: 'idempotent_jobs.outcome',
  /** How many times the key has been claimed (the claim's attempt, 1 first). */
  attempt: 'idempotent_jobs.attempt',
  step: 'idempotent_jobs.step',
  stepPosition: 'idempotent_jobs.step_position',
  groupCommit: 'idempotent_jobs.group_commit',
  messagingSystem: 'messaging.system',
  messagingDestination: 'messaging.destination.name',
  messagingOperation: 'messaging.operation.type',
  messageId: 'messaging.message.id',
  /** BullMQ's attempt of the job (1 first): counts retries, not deferrals. */
  deliveryAttempt: 'messaging.bullmq.attempt',
} as const;

/** Options of {@link configureTracing}. */
export interface TracingOptions {
  /**
   * Put idempotency keys on spans as they are. Off, a span carries a hash of scope and key
   * instead (keys can carry personal data: e-mail addresses, order numbers).
   * @defaultValue `false` (the runnable processes: `TRACE_KEYS=true` turns it on)
   */
  readonly recordKeys?: boolean;
}

let recordKeys = false;

/** Sets how the library's spans show idempotency keys (process-wide, as the tracer provider is). */
export function configureTracing(options: TracingOptions): void {
  recordKeys = options.recordKeys ?? false;
}

/**
 * A key's hash as spans show it: 32 hex digits of SHA-256 over `[scope, key]`, the same as the
 * key's BullMQ job id after `ij_`, so a trace can be found from `idempotent-jobs keys get`.
 */
export function traceKeyHash(scope: string, key: string): string {
  return createHash('sha256').update(JSON.stringify([scope, key])).digest('hex').slice(0, 32);
}

/** Scope and key (or its hash) of a span. */
export function keyAttributes(scope: string, key: string): Attributes {
  return recordKeys ? { [ATTR.scope]: scope, [ATTR.key]: key } : { [ATTR.scope]: scope, [ATTR.keyHash]: traceKeyHash(scope, key) };
}

/** Attributes of a message span: the queue, the BullMQ job id, scope and key (or its hash). */
export function messageAttributes(queue: string, jobId: string, scope: unknown, key: unknown, operation: 'send' | 'receive' | 'process'): Attributes {
  return {
    [ATTR.messagingSystem]: 'bullmq',
    [ATTR.messagingOperation]: operation,
    [ATTR.messagingDestination]: queue,
    [ATTR.queue]: queue,
    [ATTR.messageId]: jobId,
    // A row or job not under the wire contract names no key: the worker will refuse it.
    ...(typeof scope === 'string' && typeof key === 'string' && keyAttributes(scope, key)),
  };
}
