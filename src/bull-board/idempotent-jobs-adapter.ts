import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import type { ExternalJobUrl, JobStatus, QueueAdapterOptions, QueueJobJson } from '@bull-board/api/typings/app';
import type { AnyQueue } from '../bullmq/queue-connection.js';
import { keysOfQueue } from '../bullmq/keys-by-queue.js';
import { identityFromWireContract, type JobIdentity, type JobLike } from '../consumer/wire-contract.js';
import { ValidationError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { PostgresOperatorStore, type OperatorStore } from '../store/operator-store.js';
import { jobKeyView, keySummary, type JobKeyView } from './job-key-view.js';
import { refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link IdempotentJobsAdapter}: Bull Board's own queue adapter options, and where the keys are. */
export interface IdempotentJobsAdapterOptions extends Partial<QueueAdapterOptions> {
  /**
   * The claim protocol the queue's workers use (its database and schema hold the keys). Unset:
   * the keys of a queue opened by `IdempotentJobsModule.registerQueue` (as Bull Board's NestJS
   * module builds the adapter from the queue alone).
   * @defaultValue the registered queue's keys
   */
  readonly keys?: IdempotencyKeys;
  /**
   * The key inspector's page (`https://ops.example.com/ui/`, or `/ui/` on the same host): each
   * job links to its key's page there (Bull Board's `externalJobUrl`), which asks for the same
   * admin tokens as ever. Ignored when `externalJobUrl` is given.
   * @defaultValue unset (no link)
   */
  readonly inspectorUrl?: string;
  /** Reads key and scope from a job, as the workers' `keyOf` does. @defaultValue the wire contract */
  readonly keyOf?: (job: JobLike) => JobIdentity;
}

const BULL_BOARD_OPTION_NAMES = ['readOnlyMode', 'allowRetries', 'allowCompletedRetries', 'prefix', 'description', 'displayName', 'delimiter', 'externalJobUrl', 'jobDataSchema'];
const OWN_OPTION_NAMES = ['keys', 'inspectorUrl', 'keyOf'];

/** A job as Bull Board reads it, which the adapter may give a `toJSON` of its own. */
type BoardJob = { id?: string | null; name: string; data: unknown; toJSON(): QueueJobJson };

/**
 * The key inspector's link for a job: `externalJobUrl` for Bull Board's queue options, reading
 * the job's scope and key by the wire contract (or `keyOf`). For a queue adapter built by Bull
 * Board's NestJS module: `BullBoardModule.forFeature({ name: 'payments', adapter: IdempotentJobsAdapter, options: { externalJobUrl: keyInspectorLink('/ui/') } })`.
 *
 * @param inspectorUrl - the key inspector's page, absolute or relative to the board's page
 */
export function keyInspectorLink(inspectorUrl: string, keyOf: (job: JobLike) => JobIdentity = identityFromWireContract): (job: QueueJobJson) => ExternalJobUrl {
  if (typeof inspectorUrl !== 'string' || inspectorUrl === '') {
    throw new ValidationError('INVALID_OPTIONS', 'inspectorUrl', "keyInspectorLink needs the key inspector's page, e.g. 'https://ops.example.com/ui/'.");
  }
  return (job) => {
    const identity = identityOr(keyOf, { name: job.name, data: job.data });
    if (!identity) return { href: inspectorUrl, displayText: 'Key inspector (this job names no key)' };
    return { href: keyPageUrl(inspectorUrl, identity.scope, identity.key), displayText: 'Key in the key inspector' };
  };
}

/** The inspector's route for one key (its page reads the address after `#`, the parameters encoded). */
function keyPageUrl(inspectorUrl: string, scope: string, key: string): string {
  const base = inspectorUrl.split('#')[0]!;
  return `${base}#/key?scope=${encodeURIComponent(scope)}&key=${encodeURIComponent(key)}`;
}

function identityOr(keyOf: (job: JobLike) => JobIdentity, job: JobLike): JobIdentity | undefined {
  try {
    return keyOf(job);
  } catch {
    return undefined;
  }
}

/**
 * A Bull Board queue adapter for this library's queues (on Redis or the Postgres backend): Bull
 * Board's BullMQ adapter, whose jobs also show their idempotency key. Each job's **Progress**
 * tab holds `idempotencyKey` (status, whose run made the effect, owner and fence, the lease left
 * by the database's clock, the steps, the stored result or error, the tombstone of a deleted
 * key) beside the job's own progress (`jobProgress`); its name in the list says the key's state;
 * with `inspectorUrl`, its link opens the key's page in the key inspector. The keys of a page
 * of jobs are read in one statement per refresh.
 *
 * Bull Board serves what it shows without authentication of its own: mount it behind your
 * application's (the key inspector keeps its admin tokens and its CSP).
 *
 * @example
 * ```ts
 * import { createBullBoard } from '@bull-board/api';
 * import { ExpressAdapter } from '@bull-board/express';
 * import express from 'express';
 * import { IdempotencyKeys, IdempotentProducer } from 'idempotent-jobs';
 * import { IdempotentJobsAdapter } from 'idempotent-jobs/bull-board';
 *
 * const keys = new IdempotencyKeys({ db });
 * const payments = new IdempotentProducer({ queue: 'payments', connection: { host: '127.0.0.1', port: 6379 } });
 * const serverAdapter = new ExpressAdapter();
 * serverAdapter.setBasePath('/admin/queues');
 * createBullBoard({
 *   queues: [new IdempotentJobsAdapter(payments.queue, { keys, inspectorUrl: 'https://ops.example.com/ui/' })],
 *   serverAdapter,
 * });
 * const app = express();
 * app.use('/admin/queues', serverAdapter.getRouter());
 * ```
 */
export class IdempotentJobsAdapter extends BullMQAdapter {
  readonly #store: OperatorStore;
  readonly #keyOf: (job: JobLike) => JobIdentity;
  readonly #inspectorUrl: string | undefined;

  constructor(queue: AnyQueue | ConstructorParameters<typeof BullMQAdapter>[0], options: IdempotentJobsAdapterOptions = {}) {
    checkOptions(options);
    const keyOf = options.keyOf ?? identityFromWireContract;
    const { keys: givenKeys, inspectorUrl, keyOf: _keyOf, ...boardOptions } = options;
    super(queue as never, {
      ...boardOptions,
      ...(boardOptions.externalJobUrl === undefined && inspectorUrl !== undefined ? { externalJobUrl: keyInspectorLink(inspectorUrl, keyOf) } : {}),
    });
    const keys = givenKeys ?? keysOfQueue(queue);
    if (!keys) {
      throw new ValidationError(
        'INVALID_OPTIONS',
        'keys',
        `IdempotentJobsAdapter for queue "${(queue as AnyQueue).name}" needs the keys its workers claim: pass { keys }, or register the queue with IdempotentJobsModule.registerQueue (whose queues carry their keys).`,
      );
    }
    this.#store = new PostgresOperatorStore(keys.db, keys.options.schema);
    this.#keyOf = keyOf;
    this.#inspectorUrl = inspectorUrl;
    this.setFormatter('name', (job: QueueJobJson) => {
      const view = (job.progress as { idempotencyKey?: JobKeyView } | undefined)?.idempotencyKey;
      return view ? `${job.name} · ${keySummary(view)}` : job.name;
    });
  }

  /** One job, as Bull Board's BullMQ adapter reads it, its key's view in its progress. */
  override async getJob(id: string): Promise<any> {
    const job = (await super.getJob(id)) as BoardJob | undefined;
    if (job) await this.#withKeys([job]);
    return job;
  }

  /** A page of jobs, as Bull Board's BullMQ adapter reads it, their keys' views in their progress (one statement for all). */
  override async getJobs(jobStatuses: JobStatus[], start?: number, end?: number): Promise<any[]> {
    const jobs = (await super.getJobs(jobStatuses, start, end)) as BoardJob[];
    await this.#withKeys(jobs);
    return jobs;
  }

  /** Reads the keys of `jobs` (one statement) and gives each job a `toJSON` whose progress carries its key's view. */
  async #withKeys(jobs: readonly BoardJob[]): Promise<void> {
    const named = jobs.map((job) => ({ job, identity: identityOr(this.#keyOf, { name: job.name, data: job.data }) }));
    const pairs = named.flatMap(({ identity }) => (identity ? [{ scope: identity.scope, key: identity.key }] : []));
    if (pairs.length === 0) return;
    const { records, steps, tombstones, now } = await this.#store.keysOfJobs(pairs);
    const id = (scope: string, key: string) => JSON.stringify([scope, key]);
    const recordOf = new Map(records.map((record) => [id(record.scope, record.key), record]));
    const tombstoneOf = new Map(tombstones.map((tombstone) => [id(tombstone.scope, tombstone.key), tombstone]));
    for (const { job, identity } of named) {
      if (!identity) continue;
      const view = jobKeyView({
        jobId: job.id ?? undefined,
        scope: identity.scope,
        key: identity.key,
        record: recordOf.get(id(identity.scope, identity.key)),
        steps: steps.filter((step) => step.scope === identity.scope && step.key === identity.key),
        tombstone: tombstoneOf.get(id(identity.scope, identity.key)),
        now,
        inspector: this.#inspectorUrl === undefined ? undefined : keyPageUrl(this.#inspectorUrl, identity.scope, identity.key),
      });
      const own = job.toJSON.bind(job);
      Object.defineProperty(job, 'toJSON', {
        configurable: true,
        value: () => {
          const json = own();
          const progress = json.progress;
          const hasOwn = progress !== undefined && progress !== null && progress !== 0 && progress !== false;
          return { ...json, progress: { idempotencyKey: view, ...(hasOwn ? { jobProgress: progress } : {}) } };
        },
      });
    }
  }
}

function checkOptions(options: IdempotentJobsAdapterOptions): void {
  if (options === null || typeof options !== 'object') {
    throw new ValidationError('INVALID_OPTIONS', 'options', 'IdempotentJobsAdapter takes an options object ({ keys, inspectorUrl, … }).');
  }
  refuseUnknownOptions(options, [...BULL_BOARD_OPTION_NAMES, ...OWN_OPTION_NAMES], 'new IdempotentJobsAdapter(queue, options)');
}
