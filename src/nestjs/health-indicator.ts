import { setTimeout as sleep } from 'node:timers/promises';
import { pingBullWorker } from '../bullmq/job-lookup.js';
import { describeError } from '../describe-error.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import type { IdempotentJobsRuntime } from './idempotent-jobs-runtime.js';

/** How long each part of the check may take before it counts as down. */
const CHECK_TIMEOUT_MS = 3_000;

/**
 * What {@link IdempotentJobsHealthIndicator.isHealthy} answers: `@nestjs/terminus`'s
 * `HealthIndicatorResult` shape, `{ [key]: { status, … } }`, so that it goes into
 * `health.check([…])` as it is.
 */
export type IdempotentJobsHealth<Key extends string = string> = Record<
  Key,
  {
    /** `'up'` when every part is; `'down'` otherwise (terminus then answers 503). */
    readonly status: 'up' | 'down';
    /** The keys' database: `'writable'`, or why not. */
    readonly store: string;
    /** The listener that wakes waiting duplicates: `'connected'`, `'off'` (none configured), or why not. */
    readonly listener: string;
    /** Each processor's worker, by queue: `'running'`, or why not. */
    readonly workers: Readonly<Record<string, string>>;
    /** The outbox relay: `'running'` or `'off'`. */
    readonly relay: string;
  }
>;

/**
 * A health indicator for `@nestjs/terminus`: the keys' database takes writes (it answers, is no
 * standby, and jobs are not being deferred by refused writes: a full disk, a demoted primary),
 * the listener is connected (when configured), and every processor's worker runs and reaches its
 * queue. Each part answers within 3 s or counts as down. It imports nothing of terminus: its
 * answer has terminus's result shape.
 *
 * @example
 * ```ts
 * import { Controller, Get } from '@nestjs/common';
 * import { HealthCheck, HealthCheckService } from '@nestjs/terminus';
 * import { IdempotentJobsHealthIndicator } from 'idempotent-jobs/nestjs';
 *
 * @Controller('health')
 * export class HealthController {
 *   constructor(
 *     private readonly health: HealthCheckService,
 *     private readonly jobs: IdempotentJobsHealthIndicator,
 *   ) {}
 *
 *   @Get()
 *   @HealthCheck()
 *   check() {
 *     return this.health.check([() => this.jobs.isHealthy('jobs')]);
 *   }
 * }
 * ```
 */
export class IdempotentJobsHealthIndicator {
  readonly #runtime: IdempotentJobsRuntime;

  /** Built by the module (inject it); `runtime` is the module's. */
  constructor(runtime: IdempotentJobsRuntime) {
    this.#runtime = runtime;
  }

  /** Checks the store, the listener and the workers; `key` names the result. */
  async isHealthy<Key extends string = 'idempotent-jobs'>(key: Key = 'idempotent-jobs' as Key): Promise<IdempotentJobsHealth<Key>> {
    const runtime = this.#runtime;
    const [store, listener, ...workers] = await Promise.all([
      answer(() => this.#storeWritable()),
      runtime.listener ? answer(() => runtime.listener!.connect(), 'connected') : Promise.resolve('off'),
      ...runtime.processors.map(({ worker }) =>
        answer(async () => {
          if (!worker.bullWorker.isRunning()) throw new Error('not running (closing or closed)');
          await pingBullWorker(worker.bullWorker);
        }, 'running'),
      ),
    ]);
    const byQueue = Object.fromEntries(runtime.processors.map(({ worker }, i) => [worker.bullWorker.name, workers[i]!]));
    const up = store === 'writable' && (listener === 'connected' || listener === 'off') && workers.every((state) => state === 'running');
    const details = { status: up ? 'up' : 'down', store, listener, workers: byQueue, relay: runtime.relayRunning ? 'running' : 'off' } as const;
    return { [key]: details } as IdempotentJobsHealth<Key>;
  }

  async #storeWritable(): Promise<string> {
    const role = await new PostgresOperatorStore(this.#runtime.db, this.#runtime.keys.options.schema).serverRole();
    if (role.inRecovery) throw new Error('the server is a standby (in recovery): it takes no writes');
    if (role.transactionReadOnly || role.defaultTransactionReadOnly) throw new Error('the server is read-only (default_transaction_read_only)');
    this.#runtime.assertWritesAccepted();
    return 'writable';
  }
}

/** `check`'s answer (or `ok`), or what went wrong, within {@link CHECK_TIMEOUT_MS}. */
async function answer(check: () => Promise<unknown>, ok?: string): Promise<string> {
  const timedOut = Symbol('timed out');
  try {
    const outcome = await Promise.race([check(), sleep(CHECK_TIMEOUT_MS, timedOut, { ref: false })]);
    if (outcome === timedOut) return `no answer within ${CHECK_TIMEOUT_MS} ms`;
    return ok ?? String(outcome);
  } catch (error) {
    return describeError(error);
  }
}
