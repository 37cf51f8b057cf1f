import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import {
  resolveSweeperOptions,
  type ResolvedSweeperOptions,
  type SweeperAction,
  type SweeperOptions,
} from './maintenance-options.js';
import { jobIdFor, toWireJobData } from '../consumer/wire-contract.js';
import type { JobPresence } from './job-lookup.js';
import { isBrokerQueueName } from '../consumer/broker-queue-names.js';
import { PostgresOperatorStore, type OperatorStore } from '../store/operator-store.js';
import type { LostKeyCandidate, LostKeyCursor } from '../store/records.js';
import { defaultLogger } from '../default-logger.js';

/** One lost job the sweeper dealt with. */
export interface SweepRecovery {
  /** The key's scope. */
  readonly scope: string;
  /** The key of the lost job. */
  readonly key: string;
  /** The key's fence when the sweeper acted (a re-enqueued job's claim takes it over). */
  readonly fence: number;
  /** The queue the key's row names. */
  readonly queue: string;
  /** The job id stored on the key (the job that was lost). */
  readonly jobId: string;
  /** `reenqueued`: added back under the deterministic id; `abandoned`: key failed with `ABANDONED`. */
  readonly action: 'reenqueued' | 'abandoned';
  /** Whether BullMQ had no such job (`missing`) or had it finished with the key still processing (`finished`). */
  readonly jobWas: 'missing' | 'finished';
}

/** What one sweep did. */
export interface SweepReport {
  /** Processing keys whose lease ended more than `sweepAfterMs` ago. */
  readonly examined: number;
  /** Of those, keys whose BullMQ job still exists and will run (left to BullMQ). */
  readonly alive: number;
  /** The lost jobs re-enqueued or abandoned, one entry each. */
  readonly recoveries: readonly SweepRecovery[];
  /** Keys with no queue or job id recorded (claimed outside BullMQ): reported, never changed. */
  readonly unverifiable: number;
  /** Keys that changed while the sweeper looked (claimed again): left alone. */
  readonly changed: number;
  /** True when the sweep stopped at `maxKeysPerRun`: candidates may remain for the next run. */
  readonly more: boolean;
}

/**
 * Finds keys still `processing` long after their lease ended (`sweepAfterMs`) whose BullMQ job
 * is gone or finished: lost jobs, e.g. after Redis lost data or a job was removed by hand.
 * Per queue option: re-enqueue the job under the same deterministic id (when its payload was
 * stored with the key), or abandon the key (status `failed`, error code `ABANDONED`, so
 * duplicates replay the failure and an operator can `keys release` it). Every recovery is
 * logged with scope, key, fence and job id, and counted in the report. Keys without a
 * recorded queue and job id are logged as unverifiable: the sweeper cannot know whether
 * something will still retry them.
 *
 * @example
 * ```ts
 * import { BullmqJobLookup, Sweeper } from 'idempotent-jobs/process';
 *
 * const jobs = new BullmqJobLookup({ connection: { url: 'redis://127.0.0.1:6379' } });
 * const sweeper = new Sweeper({ db, jobs, action: 'reenqueue', queues: ['payments'] });
 * const report = await sweeper.runOnce();
 * for (const recovery of report.recoveries) console.log(`${recovery.key}: ${recovery.action} (job was ${recovery.jobWas})`);
 * await jobs.close();
 * ```
 */
export class Sweeper {
  readonly #options: ResolvedSweeperOptions;
  readonly #log: Logger;

  constructor(options: SweeperOptions) {
    this.#options = resolveSweeperOptions(options);
    this.#log = (options.logger ?? defaultLogger()).child({ component: 'sweeper', schema: this.#options.schema });
  }

  /** The resolved options. */
  get options(): ResolvedSweeperOptions {
    return this.#options;
  }

  /**
   * What serialises sweeps: sweepers of the same schema and queue list exclude each other
   * (`Maintenance` takes the sweeper lock on this name); other queue lists sweep independently.
   */
  get lockScope(): string {
    const { schema, queues } = this.#options;
    return queues === '*' ? schema : `${schema}/${[...queues].sort().join(',')}`;
  }

  /** The action for a queue: its override, else the default. */
  actionFor(queue: string): SweeperAction {
    return this.#options.queueActions[queue] ?? this.#options.action;
  }

  /** One sweep over at most `maxKeysPerRun` candidates, oldest lease first. */
  async runOnce(executor: Kysely<any> = this.#options.db): Promise<SweepReport> {
    const { schema, sweepAfterMs, batchSize, maxKeysPerRun } = this.#options;
    const store = new PostgresOperatorStore(executor, schema);
    const recoveries: SweepRecovery[] = [];
    let examined = 0;
    let alive = 0;
    let unverifiable = 0;
    let changed = 0;
    let more = false;
    let cursor: LostKeyCursor | undefined;
    for (;;) {
      const limit = Math.min(batchSize, maxKeysPerRun - examined);
      if (limit <= 0) {
        more = true;
        break;
      }
      const page = await store.findLostKeys({ sweepAfterMs, limit, after: cursor, queues: this.#options.queues });
      for (const candidate of page) {
        examined++;
        const verdict = await this.#sweepKey(store, candidate);
        if (verdict === 'alive') alive++;
        else if (verdict === 'unverifiable') unverifiable++;
        else if (verdict === 'changed') changed++;
        else recoveries.push(verdict);
      }
      if (page.length < limit) break;
      const last = page[page.length - 1]!;
      cursor = { lockedUntil: last.lockedUntilExact, scope: last.scope, key: last.key };
    }
    if (recoveries.length > 0 || unverifiable > 0) {
      this.#log.info(
        {
          examined,
          alive,
          reenqueued: recoveries.filter((r) => r.action === 'reenqueued').length,
          abandoned: recoveries.filter((r) => r.action === 'abandoned').length,
          unverifiable,
          changed,
        },
        'sweep finished',
      );
    }
    return { examined, alive, recoveries, unverifiable, changed, more };
  }

  async #sweepKey(
    store: OperatorStore,
    candidate: LostKeyCandidate,
  ): Promise<SweepRecovery | 'alive' | 'unverifiable' | 'changed'> {
    const { scope, key, fence, queue, jobId } = candidate;
    const log = this.#log.child({ scope, key, fence, jobId, queue });
    if (!queue || !jobId || queue.includes(':')) {
      // A broker consumer's key (RabbitMQ, JetStream) has no BullMQ job: its broker redelivers
      // the message. Neither has a key whose recorded queue is another name with a colon (the
      // protocol's own callers name any queue), and BullMQ could not even be asked: it refuses
      // the name, and the sweep would stop at that key every time.
      const recorded = !queue || !jobId
        ? 'has no BullMQ job recorded'
        : isBrokerQueueName(queue)
          ? `came from the broker consumer "${queue}", not from BullMQ`
          : `records the queue "${queue}", which is no BullMQ queue name (BullMQ refuses its colon)`;
      log.warn(
        { lockedUntil: candidate.lockedUntil },
        `Key "${key}" in scope "${scope}" has been processing with an ended lease since ${candidate.lockedUntil.toISOString()} ` +
          `and ${recorded}, so the sweeper cannot tell whether it is lost. ` +
          'Inspect it with `idempotent-jobs keys get` and release it with `keys release` if nothing will retry it.',
      );
      return 'unverifiable';
    }
    const deterministicId = jobIdFor(scope, key);
    const presence = await this.#presence(queue, jobId, deterministicId);
    if (presence === 'pending') return 'alive';

    const lostJob = jobToAddAgain(candidate);
    if (this.actionFor(queue) === 'reenqueue' && lostJob) {
      const policy = this.#options.retryPolicies[queue];
      const opts = policy
        ? {
            ...(policy.attempts ? { attempts: policy.attempts } : {}),
            ...(policy.backoff ? { backoff: { type: policy.backoff.type, delay: policy.backoff.delayMs } } : {}),
          }
        : undefined;
      await this.#options.jobs.reenqueue({ queue, jobId: lostJob.jobId, name: lostJob.name, data: lostJob.data, opts });
      log.warn(
        { outcome: 'reenqueued', jobWas: presence, newJobId: lostJob.jobId },
        `Lost job re-enqueued: key "${key}" in scope "${scope}" was processing with an ended lease since ` +
          `${candidate.lockedUntil.toISOString()} and its job ${jobId} is ${presence} in queue "${queue}"; ` +
          `added it again as ${lostJob.jobId} with the stored payload. The next claim takes the key over.`,
      );
      return { scope, key, fence, queue, jobId, action: 'reenqueued', jobWas: presence };
    }

    const why = lostJob ? `queue "${queue}" is set to abandon lost jobs` : 'no payload was stored with the key to re-enqueue it';
    const reason =
      `Key "${key}" in scope "${scope}" was abandoned by the sweeper: it was processing with an ended lease since ` +
      `${candidate.lockedUntil.toISOString()} and its job ${jobId} is ${presence} in queue "${queue}"; ${why}. ` +
      'Release it with `idempotent-jobs keys release` and enqueue the job again to run it.';
    const abandoned = await store.abandonKey({
      scope,
      key,
      fence,
      owner: candidate.owner,
      sweepAfterMs: this.#options.sweepAfterMs,
      retentionMs: this.#options.retentionMs,
      reason,
    });
    if (!abandoned) {
      log.info('key changed while the sweeper looked at it (claimed, extended or released again); left alone');
      return 'changed';
    }
    log.warn({ outcome: 'abandoned', jobWas: presence }, reason);
    return { scope, key, fence, queue, jobId, action: 'abandoned', jobWas: presence };
  }

  /**
   * Whether any job that will claim the key is still pending, asked where such jobs can be:
   * - in the key's recorded queue (every claim and takeover records its job's id, queue and
   *   name, so this is the queue of the job that last claimed it), under the recorded job id
   *   (a foreign producer's own id) and under the deterministic id `jobIdFor(scope, key)` (our
   *   producers', the relay's and the sweeper's re-enqueues);
   * - in each other queue this sweeper covers (an explicit list), under the deterministic id:
   *   a duplicate deferred there while a job of another queue took the key over.
   * Duplicates a foreign producer added under ids of its own are not searched (BullMQ cannot
   * search jobs by data); such a duplicate records its id when it claims, and it claims within
   * the workers' longest deferral (`deferMaxMs`, seconds) after the lease ended, long before
   * `sweepAfterMs` (minutes). Pending anywhere wins; otherwise the recorded queue's answer.
   */
  async #presence(queue: string, jobId: string, deterministicId: string): Promise<JobPresence> {
    const { queues } = this.#options;
    const others = queues === '*' ? [] : queues.filter((other) => other !== queue);
    const [recorded, ...elsewhere] = await Promise.all([
      this.#options.jobs.presence(queue, [jobId, deterministicId]),
      ...others.map((other) => this.#options.jobs.presence(other, [deterministicId])),
    ]);
    return elsewhere.includes('pending') ? 'pending' : recorded!;
  }
}

/**
 * The lost job as it was enqueued, rebuilt from what the store kept: its name, its payload, and
 * what its data said beyond them, so the job added again runs as the lost one would have:
 * - under its concurrency keys and limits, if it named any (else it would run outside them);
 * - as a run of its coalescing key, if the key is one (`<key>#<generation>`): the same job id as
 *   the lost job (the coalescing key hands that generation to that job, which runs it again with
 *   its payload and then takes the pending successor; a job of another id would only fold into
 *   the run the key believes in flight, and the successor would wait for a new arrival).
 * Undefined when the job cannot be rebuilt (no payload stored, or no job name).
 */
function jobToAddAgain(candidate: LostKeyCandidate): { jobId: string; name: string; data: unknown } | undefined {
  const { scope, key, jobName, coalescing, concurrency } = candidate;
  if (jobName === null) return undefined;
  if (coalescing && candidate.jobId) {
    const data = { ...toWireJobData(scope, coalescing.key, coalescing.payload, { concurrency }), coalesce: true };
    return { jobId: candidate.jobId, name: jobName, data };
  }
  if (!candidate.hasPayload) return undefined;
  return { jobId: jobIdFor(scope, key), name: jobName, data: toWireJobData(scope, key, candidate.payload, { concurrency }) };
}
