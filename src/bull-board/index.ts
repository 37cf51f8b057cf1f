/**
 * `idempotent-jobs/bull-board`: this library's queues in Bull Board (optional peer
 * `@bull-board/api`). `IdempotentJobsAdapter` is Bull Board's BullMQ adapter whose jobs also
 * show their idempotency key (status, owner and fence, lease left, steps, stored result or error,
 * tombstone) and link to the key inspector; mount it with `@bull-board/express`,
 * `@bull-board/fastify` or `@bull-board/nestjs` as any queue adapter.
 *
 * @packageDocumentation
 * @module idempotent-jobs/bull-board
 */
export { IdempotentJobsAdapter, keyInspectorLink, type IdempotentJobsAdapterOptions } from './idempotent-jobs-adapter.js';
export type { JobKeyStepView, JobKeyTombstoneView, JobKeyView } from './job-key-view.js';
