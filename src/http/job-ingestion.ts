import type { IdempotentProducer } from '../bullmq/idempotent-producer.js';
import { fingerprintOfJob } from '../bullmq/job-fingerprint.js';
import { jobIdFor } from '../consumer/wire-contract.js';
import { IdempotencyError, ValidationError } from '../errors.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { MAX_PAYLOAD_DEPTH, describeJsonProblem, findJsonProblem } from '../json-limits.js';
import { summarizeStep, type StepSummary } from '../protocol/job-steps.js';
import type { KeySettledListener } from '../store/key-settled-listener.js';
import { PostgresOperatorStore } from '../store/operator-store.js';
import type { KeyRecord, KeyRetention, StepRecord } from '../store/records.js';

/** One step of a multi-step job (`ctx.step`), as the HTTP API reports it: its summary and its stored result (null until recorded). */
export interface StepView extends StepSummary {
  /** The step's stored result; null until recorded. */
  readonly result: unknown;
}

/** A job's state as the HTTP API reports it. */
export type JobState = 'queued' | 'processing' | 'completed' | 'failed';

/** What the API answers about one accepted request (POST and GET alike). */
export interface JobView {
  /** The queue the job was submitted to. */
  readonly queue: string;
  /** The Idempotency-Key; the job's key in scope `<tenant>`. */
  readonly key: string;
  /** Job name. */
  readonly name: string;
  /** BullMQ job id (deterministic from tenant and key). */
  readonly jobId: string;
  /** Where the job is: `queued` until a worker claims its key, then `processing`, `completed` or `failed`. */
  readonly state: JobState;
  /** The handler's stored result, when `completed`. */
  readonly result?: unknown;
  /** The stored error (`{ name, message, code? }`), when `failed`. */
  readonly error?: unknown;
  /** How many times a worker has claimed the job's key (0 until one starts it). */
  readonly attempts: number;
  /** When the request was accepted (database clock). */
  readonly acceptedAt: string;
  /** When a worker first claimed the job's key, or null. */
  readonly startedAt: string | null;
  /** When the job completed or failed for good, or null. */
  readonly finishedAt: string | null;
  /** The steps the job's key recorded or started, in position order (empty for a job without steps). */
  readonly steps: readonly StepView[];
  /** Once the job's key finished: when its result stops being kept (its retention, the job's own or the workers'). */
  readonly expiresAt?: string;
  /** The job's own tombstone window, when it asked for one: how long after it finished its duplicates stay refused. */
  readonly tombstoneMs?: number;
}

/** What one POST did. */
export type SubmitOutcome =
  | {
      /** The job was written to the outbox with the request's record (HTTP 202, or 200 when it had finished by the time the answer read its state, as a `Prefer: wait` lets it). */
      readonly kind: 'created';
      /** The job as just accepted. */
      readonly view: JobView;
    }
  | {
      /** The same request was accepted before: nothing new was enqueued (answered with `Idempotent-Replayed: true`). */
      readonly kind: 'replayed';
      /** The job the first request created, as it is now. */
      readonly view: JobView;
    }
  | {
      /** The key was used before with another queue, job name or payload: nothing was enqueued (422). */
      readonly kind: 'key-reused';
    }
  | {
      /** A concurrent request with the same key is being handled (409). */
      readonly kind: 'in-progress';
      /** When to try again. */
      readonly retryAfterMs: number;
    }
  | ({
      /**
       * The same request was accepted before and its record has expired; only its tombstone is
       * left, so nothing was enqueued and the job's state cannot be told any more (410).
       */
      readonly kind: 'expired';
    } & ExpiredRequest);

/** What is left of a request whose record expired: when it was accepted, and how long its key stays refused. */
export interface ExpiredRequest {
  /** When the request was accepted (database clock). */
  readonly acceptedAt: Date;
  /** Until when the key stays refused (its tombstone's end); after it the key is free. */
  readonly refusedUntil: Date;
}

/** One POST's contents, after authentication and validation. */
export interface SubmitRequest {
  /** The caller's tenant: the job's key lives in scope `<tenant>`, the request record in `http:<tenant>`. */
  readonly tenant: string;
  /** The queue to enqueue into; it must have a producer. */
  readonly queue: string;
  /** The `Idempotency-Key`. */
  readonly key: string;
  /** The job name. */
  readonly name: string;
  /** The job payload (the request body). */
  readonly payload: unknown;
  /** The job's own retention (the query's `resultMs`, `tombstoneMs`); not part of the request's fingerprint. @defaultValue unset */
  readonly retention?: KeyRetention;
}

/**
 * What the request record stores as its result: enough to find the job again and to tell
 * whether the job key's row is this request's job (same fingerprint) or someone else's.
 */
interface Receipt {
  readonly queue: string;
  readonly name: string;
  readonly jobId: string;
  readonly jobFingerprint: string;
}

/**
 * The request record's scope: `http:<tenant>`. Tenant names have no `:`, so it never equals a
 * tenant's own scope (where the jobs' keys live) nor another tenant's request scope.
 */
export const requestScopeFor = (tenant: string): string => `http:${tenant}`;

/**
 * Claims one POST makes at most: each after the first follows a record deleted between its
 * claim and the read of its answer, which needs the janitor to delete it again within a round trip.
 */
const CLAIMS_PER_SUBMIT = 3;

/** Options of {@link JobIngestion}. */
export interface JobIngestionOptions {
  /** The claim protocol: its database holds the request records, the jobs' keys and the outbox. */
  readonly keys: IdempotencyKeys;
  /** One producer per accepted queue, by queue name. */
  readonly producers: ReadonlyMap<string, IdempotentProducer>;
  /** Wakes {@link JobIngestion.waitForSettled} when a job's key settles. @defaultValue unset (no waiting) */
  readonly listener?: KeySettledListener;
  /** Called after a request committed its job to the outbox (the server nudges its relay). @defaultValue unset */
  readonly onCreated?: () => void;
  /**
   * How long to wait for BullMQ when reading a job's state. Past it (Redis down) the job is
   * reported `queued`: it is safely in the outbox or in BullMQ, and no worker has claimed it.
   * @defaultValue `2_000`
   */
  readonly queueReadTimeoutMs?: number;
  /** Told when a BullMQ read timed out or failed. @defaultValue unset (ignored) */
  readonly onQueueReadError?: (error: unknown) => void;
}

/**
 * The HTTP API's semantics, without HTTP: accept a job under an Idempotency-Key exactly once,
 * replay the answer to retries, and report a job's state.
 *
 * A request is claimed with the single-transaction fast path
 * ({@link IdempotencyKeys.executeOnce}) on `(http:<tenant>, key)` with the fingerprint of
 * queue + job name + payload; its effect writes the job into the outbox in the same
 * transaction. So the request record and the job exist together or not at all: a crash before
 * the commit leaves neither (the client's retry starts afresh), after it both (the relay
 * delivers the job; a retry replays). A concurrent duplicate waits on the record's index entry
 * (at most `claimLockTimeoutMs`) and then replays, or is told the request is in progress.
 */
export class JobIngestion {
  readonly #options: JobIngestionOptions;

  constructor(options: JobIngestionOptions) {
    this.#options = Object.freeze({ ...options });
  }

  /**
   * Accepts a job once per (tenant, key); see {@link SubmitOutcome}. Throws a
   * {@link ValidationError} for a payload that cannot be stored (see `json-limits.ts`).
   *
   * The answer is read after the claim (the job's view). A record the janitor deleted in between
   * (it expired right then) is claimed again when the claim found it (a retry), so the request is
   * answered as its key stands now: `expired` while its tombstone lasts, else a new request; a
   * record this request created is answered `created` from what it wrote. A record that keeps
   * vanishing (a retention shorter than a round trip) is answered `in-progress`, for the client
   * to retry.
   */
  async submit(request: SubmitRequest): Promise<SubmitOutcome> {
    const { keys } = this.#options;
    assertStorablePayload(request.payload);
    for (let claims = 1; claims <= CLAIMS_PER_SUBMIT; claims++) {
      const answer = await this.#claimAndAnswer(request);
      if (answer) return answer;
    }
    return { kind: 'in-progress', retryAfterMs: keys.options.claimLockTimeoutMs };
  }

  /** One claim of the request's record and its answer; undefined when the record was gone by the time the answer was read. */
  async #claimAndAnswer(request: SubmitRequest): Promise<SubmitOutcome | undefined> {
    const { keys } = this.#options;
    const { tenant, queue, key, name, payload, retention } = request;
    const producer = this.#producer(queue);
    const receipt: Receipt = {
      queue,
      name,
      jobId: jobIdFor(tenant, key),
      jobFingerprint: keys.fingerprint({ name, payload }),
    };
    let outcome;
    try {
      outcome = await keys.executeOnce(
        requestScopeFor(tenant),
        key,
        keys.fingerprint({ queue, name, payload }),
        async (tx) => {
          await producer.enqueue({ name, scope: tenant, key, data: payload, ...(retention ? { retention } : {}) }, { tx });
          return receipt;
        },
        { queue, jobName: name, jobId: receipt.jobId },
      );
    } catch (error) {
      // Writers kept racing on this key: as good as in progress; the client retries.
      if (error instanceof IdempotencyError && error.code === 'CLAIM_CONTENDED') {
        return { kind: 'in-progress', retryAfterMs: keys.options.claimLockTimeoutMs };
      }
      throw error;
    }
    switch (outcome.kind) {
      case 'executed': {
        this.#options.onCreated?.();
        // A record the janitor deleted right after its commit (a retention shorter than this
        // round trip) is answered from the receipt: the job was created, and claiming again
        // could enqueue it a second time.
        const view = (await this.view(tenant, queue, key)) ?? (await this.#viewOfReceipt(receipt, key));
        return { kind: 'created', view };
      }
      case 'completed': {
        if (outcome.resultExpired) return { kind: 'expired', acceptedAt: outcome.resultExpired.finishedAt, refusedUntil: outcome.resultExpired.tombstoneExpiresAt };
        const view = await this.view(tenant, queue, key);
        return view && { kind: 'replayed', view };
      }
      case 'key-reused':
        return { kind: 'key-reused' };
      case 'in-progress':
        return { kind: 'in-progress', retryAfterMs: outcome.retryAfterMs };
      case 'failed':
        // Request records are only ever written completed; a failed one was set by hand.
        throw new Error(`The request record of key "${key}" in scope "${requestScopeFor(tenant)}" is marked failed; release it with the keys CLI.`);
    }
  }

  /**
   * The state of the job a tenant's request with `key` created on `queue`, or undefined when
   * this tenant made no such request (or it was made on another queue, or has expired).
   */
  view(tenant: string, queue: string, key: string): Promise<JobView | undefined> {
    return this.#view(tenant, queue, key, true);
  }

  /** The tombstone of a tenant's request whose record expired, if the key is still refused. */
  async expired(tenant: string, key: string): Promise<ExpiredRequest | undefined> {
    const { keys } = this.#options;
    const tombstone = await new PostgresOperatorStore(keys.db, keys.options.schema).getTombstone(requestScopeFor(tenant), key);
    return tombstone && { acceptedAt: tombstone.finishedAt, refusedUntil: tombstone.expiresAt };
  }

  /** {@link view}; without `withSteps` the steps are not read (and listed as empty). */
  async #view(tenant: string, queue: string, key: string, withSteps: boolean): Promise<JobView | undefined> {
    const { keys } = this.#options;
    const record = await keys.get(requestScopeFor(tenant), key);
    const receipt = record?.status === 'completed' ? asReceipt(record.result) : undefined;
    if (!record || !receipt || receipt.queue !== queue) return undefined;
    const jobKey = await keys.get(tenant, key);
    // The job key's row is this request's job only if it was claimed with this job's payload;
    // otherwise (another producer's job under the same key) the worker refuses ours as reused.
    const ours = jobKey && jobKey.fingerprint === receipt.jobFingerprint ? jobKey : undefined;
    const base = { queue, key, name: receipt.name, jobId: receipt.jobId, acceptedAt: record.createdAt.toISOString() };
    const view =
      ours && ours.status !== 'processing'
        ? settledView(base, ours)
        : ours && ours.owner !== null
          ? { ...base, state: 'processing' as const, attempts: ours.attempts, startedAt: ours.createdAt.toISOString(), finishedAt: null }
          : { ...base, ...(await this.#fromQueue(queue, receipt, ours)) };
    // Steps are kept under the job's key: only a key claimed with this job's payload has ours.
    const steps = ours && withSteps ? (await keys.getSteps(tenant, key)).map(toStepView) : [];
    return { ...view, steps };
  }

  /**
   * Waits (LISTEN/NOTIFY, no polling) until the job's key settles or `timeoutMs` passes or
   * `signal` aborts, then returns the job's view. Undefined when no listener is configured.
   */
  async waitForSettled(tenant: string, queue: string, key: string, timeoutMs: number, signal: AbortSignal): Promise<JobView | undefined> {
    const { listener } = this.#options;
    if (!listener || signal.aborted) return undefined;
    await listener.waitForSettled(tenant, key, timeoutMs, async () => isSettled(await this.#view(tenant, queue, key, false)), signal);
    return this.view(tenant, queue, key);
  }

  /** The view of a job just created, from its receipt alone (its request record already gone). */
  async #viewOfReceipt(receipt: Receipt, key: string): Promise<JobView> {
    const base = { queue: receipt.queue, key, name: receipt.name, jobId: receipt.jobId, acceptedAt: new Date().toISOString() };
    return { ...base, ...(await this.#fromQueue(receipt.queue, receipt, undefined)), steps: [] };
  }

  /** The job's state from BullMQ, for a job whose key no worker holds (yet, or any more). */
  async #fromQueue(queue: string, receipt: Receipt, released: KeyRecord | undefined) {
    const { jobId } = receipt;
    const bullQueue = this.#producer(queue).queue;
    let state: Awaited<ReturnType<typeof bullQueue.getJobState>> | undefined;
    let job: Awaited<ReturnType<typeof bullQueue.getJob>> | undefined;
    try {
      await withTimeout(this.#options.queueReadTimeoutMs ?? 2_000, async () => {
        // State first, then the job: a job read before its state could be older than the state.
        state = await bullQueue.getJobState(jobId);
        job = state === 'unknown' ? undefined : await bullQueue.getJob(jobId);
        // The id may hold an earlier request's job (same key, another payload): not this one's,
        // which is still in the outbox or waits for that job to finish. Or the finished job
        // whose state was read has just been replaced by this one's, which has not run yet.
        const keys = this.#options.keys;
        const finishedState = state === 'completed' || state === 'failed';
        if (job && (fingerprintOfJob(job, (identity) => keys.fingerprint(identity)) !== receipt.jobFingerprint || (finishedState && !job.finishedOn))) {
          [state, job] = ['unknown', undefined];
        }
      });
    } catch (error) {
      this.#options.onQueueReadError?.(error);
      state = undefined;
      job = undefined;
    }
    const startedAt = released?.createdAt.toISOString() ?? (job?.processedOn ? new Date(job.processedOn).toISOString() : null);
    const attempts = released?.attempts ?? job?.attemptsMade ?? 0;
    if (state === 'failed' && job) {
      // Failed before any claim stored an error: malformed data, or the key was reused by
      // another producer with another payload. BullMQ's reason says which.
      const finishedAt = job.finishedOn ? new Date(job.finishedOn).toISOString() : null;
      return { state: 'failed' as const, error: { name: 'JobFailed', message: job.failedReason }, attempts, startedAt, finishedAt };
    }
    if (state === 'completed' && job && !released) {
      const finishedAt = job.finishedOn ? new Date(job.finishedOn).toISOString() : null;
      return { state: 'completed' as const, result: job.returnvalue, attempts, startedAt, finishedAt };
    }
    return { state: state === 'active' ? ('processing' as const) : ('queued' as const), attempts, startedAt, finishedAt: null };
  }

  #producer(queue: string): IdempotentProducer {
    const producer = this.#options.producers.get(queue);
    if (!producer) throw new Error(`No producer for queue "${queue}"; the route must check the queue first.`);
    return producer;
  }
}

/** True for `completed` and `failed`. */
export function isSettled(view: JobView | undefined): boolean {
  return view?.state === 'completed' || view?.state === 'failed';
}

function toStepView(step: StepRecord): StepView {
  return { ...summarizeStep(step), result: step.recordedAt === null ? null : step.result };
}

function settledView(base: Pick<JobView, 'queue' | 'key' | 'name' | 'jobId' | 'acceptedAt'>, row: KeyRecord): Omit<JobView, 'steps'> {
  const common = {
    ...base,
    attempts: row.attempts,
    startedAt: row.createdAt.toISOString(),
    finishedAt: (row.completedAt ?? row.updatedAt).toISOString(),
    ...(row.expiresAt ? { expiresAt: row.expiresAt.toISOString() } : {}),
    ...(row.tombstoneMs === null ? {} : { tombstoneMs: row.tombstoneMs }),
  };
  return row.status === 'completed' ? { ...common, state: 'completed', result: row.result } : { ...common, state: 'failed', error: row.error };
}

async function withTimeout(ms: number, work: () => Promise<void>): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      work(),
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`BullMQ did not answer within ${ms} ms`)), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** The outbox stores the payload as jsonb: the body parser's limits, for callers that are not the HTTP API. */
function assertStorablePayload(payload: unknown): void {
  const found = findJsonProblem(payload, { maxDepth: MAX_PAYLOAD_DEPTH, allowNul: false });
  if (found) throw new ValidationError('INVALID_JOB_DATA', `payload${found.pointer}`, `The payload ${describeJsonProblem(found)}. Nothing was enqueued.`);
}

function asReceipt(value: unknown): Receipt | undefined {
  if (value === null || typeof value !== 'object') return undefined;
  const r = value as Record<string, unknown>;
  return typeof r.queue === 'string' && typeof r.name === 'string' && typeof r.jobId === 'string' && typeof r.jobFingerprint === 'string'
    ? (r as unknown as Receipt)
    : undefined;
}
