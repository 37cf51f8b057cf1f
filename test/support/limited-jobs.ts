/**
 * Workers and jobs of the concurrency-limit tests: workers on a test's schema and Redis prefix,
 * jobs that each name one concurrency key, the effect row a handler writes, and the closing of
 * whatever a test started (`closeAll`, after each test).
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { createIdempotentWorker, type IdempotentWorker, type IdempotentWorkerOptions } from '../../src/index.js';
import type { TestEnv } from './test-env.js';

/** What a test gives a worker beyond the defaults: the handler, and `keys` among the rest. */
export type LimitedWorkerOptions<P> = Partial<IdempotentWorkerOptions<P, unknown>> & Pick<IdempotentWorkerOptions<P, unknown>, 'handler' | 'keys'>;

export class LimitedJobs {
  readonly #env: TestEnv;
  readonly #workers: IdempotentWorker<any, any>[] = [];
  readonly #queues: Queue[] = [];

  constructor(env: TestEnv) {
    this.#env = env;
  }

  /** A worker of `queue` (concurrency 8, silent) with `options` over the defaults; closed by {@link closeAll}. */
  startWorker<P>(queue: string, options: LimitedWorkerOptions<P>): IdempotentWorker<P, unknown> {
    const worker = createIdempotentWorker<P>({
      queue,
      connection: { url: this.#env.redisUrl },
      prefix: this.#env.redisPrefix,
      concurrency: 8,
      logger: pino({ level: 'silent' }),
      ...options,
    });
    this.#workers.push(worker);
    return worker;
  }

  /** `count` jobs `<scope>-<n>` (their ids too), in order, each naming `limit`'s concurrency key, 3 attempts. */
  async addJobs(queueName: string, scope: string, count: number, limit: { key: string; limit: number }): Promise<{ queue: Queue; ids: string[] }> {
    const queue = new Queue(queueName, { connection: { url: this.#env.redisUrl }, prefix: this.#env.redisPrefix });
    this.#queues.push(queue);
    const ids = Array.from({ length: count }, (_, n) => `${scope}-${n}`);
    await queue.addBulk(
      ids.map((id, n) => ({ name: 'sync', data: { idempotencyKey: id, scope, payload: { n }, concurrencyKey: limit.key, concurrencyLimit: limit.limit }, opts: { jobId: id, attempts: 3 } })),
    );
    return { queue, ids };
  }

  /** The effect row of a run, written in its transaction `tx`. */
  insertEffect(tx: any, scope: string, key: string, fence: number) {
    return sql`insert into ${sql.id(this.#env.schema, 'effects')} (scope, key, fence, worker) values (${scope}, ${key}, ${fence}, 'w')`.execute(tx);
  }

  /** Closes every worker (forced) and queue started since the last call. */
  async closeAll(): Promise<void> {
    await Promise.all(this.#workers.splice(0).map((w) => w.close({ force: true })));
    await Promise.all(this.#queues.splice(0).map((q) => q.close()));
  }
}
