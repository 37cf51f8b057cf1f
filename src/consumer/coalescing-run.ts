import { KeyFailedError, ValidationError } from '../errors.js';
import type { FaultPoint } from '../fault-hook.js';
import type { IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { generationKey } from '../store/coalescing-keys.js';
import type { JobLogger } from './job-logger.js';
import type { RunFailures } from './run-failures.js';
import { describeFailure, type Run, type RunOutcome, type RunResult } from './run-outcome.js';
import type { JobIdentity } from './wire-contract.js';
import type { ResolvedWorkerTiming } from './worker-timing.js';

/** What a coalescing run needs of the runner around it. */
export interface CoalescingRunDeps<P, M> {
  readonly keys: IdempotencyKeys;
  readonly timing: ResolvedWorkerTiming;
  readonly failures: RunFailures<P, M>;
  /** Keep each generation's payload on its key (`storePayload`). */
  readonly storePayload: boolean;
  /** Runs one generation as a job of its own key (in its concurrency slots, if any). */
  readonly runPath: (run: Run<P, M>) => Promise<RunResult>;
  /** Reports a generation's run that ended before the job goes on to the pending successor. */
  readonly report: (run: Run<P, M>, identity: JobIdentity<P>, log: JobLogger, result: RunResult) => RunOutcome;
  /** The runner's fault hook (chaos testing): called around the hand-over, where what it throws counts as the hand-over's. */
  readonly fault: (point: FaultPoint, identity: JobIdentity<P>) => Promise<void>;
}

/** Outcomes after which a generation is over: its key is finished (or never will run). */
const GENERATION_ENDED = new Set<RunOutcome['kind']>(['completed', 'replayed', 'replayed-failure', 'failed-permanently', 'key-reused']);

/**
 * Coalescing mode: the job either runs the key's next generation (each generation its own
 * idempotency key, `<key>#<generation>`, so each run's effect commits once, and a redelivered
 * job runs or replays its own generation) or is folded into the run in flight, its payload
 * becoming the pending successor's. A job that ran a generation then runs the pending
 * successor, if one arrived meanwhile, until none is pending; each run is reported as it ends,
 * and the job's outcome is its last run's. A run that did not end (deferred, retried, store
 * fault) ends the job there: its redelivery picks the same generation up again.
 *
 * The hand-over to the successor is where the job's own work ends and the key's goes on: a
 * store fault there defers the job without using an attempt (never completes it, which would
 * leave the successor pending with nobody to run it), and its redelivery, finding its generation
 * ended, takes the successor then (`coalesce_arrive`), or finds nothing left to run (`finished`).
 */
export async function runCoalescing<P, M>(run: Run<P, M>, deps: CoalescingRunDeps<P, M>): Promise<RunResult> {
  const { keys, timing, failures } = deps;
  const { delivery, identity } = run;
  const { scope, key } = identity;
  if (delivery.id === undefined) {
    const error = new ValidationError('INVALID_JOB_DATA', 'job.id', `A coalescing job needs a job (message) id of its own (scope "${scope}", key "${key}").`);
    return { outcome: { kind: 'invalid-message', reason: describeFailure(identity, error), error } };
  }
  let next: { readonly generation: number; readonly payload: unknown } | undefined;
  try {
    const arrival = await keys.coalesceArrive(scope, key, delivery.id, identity.payload, { staleMs: timing.leaseMs * 10, sentAtMs: delivery.sentAtMs });
    if (arrival.action === 'coalesced') return { outcome: { kind: 'replayed', result: null, coalesced: true } };
    if (arrival.action === 'finished') return await replayEnded(run, keys, generationKey(key, arrival.generation));
    next = arrival;
  } catch (error) {
    return failures.storeFault(run, error);
  }
  for (;;) {
    const payload = next.payload as P;
    const generation: JobIdentity<P> = { ...identity, key: generationKey(key, next.generation), payload, fingerprintOf: { name: delivery.name, payload }, coalesce: undefined };
    const log = run.log.with({ generation: next.generation });
    const result = await deps.runPath({
      ...run,
      // In flight for every arrival and janitor to see (see Run.leased): a run they could not
      // see, past the stale bound, would be taken for a lost one and its generation run again.
      leased: true,
      identity: generation,
      fingerprint: keys.fingerprint(generation.fingerprintOf),
      claimOptions: { ...run.claimOptions, ...(deps.storePayload ? { payload } : {}) },
      log,
    });
    if (!GENERATION_ENDED.has(result.outcome.kind)) return result;
    let successor: typeof next | undefined;
    try {
      await deps.fault('before-hand-over', identity);
      successor = await keys.coalesceNext(scope, key, delivery.id, next.generation);
      await deps.fault('after-hand-over', identity);
    } catch (error) {
      // The successor stays pending for this job's redelivery (or a newer arrival) to run: the
      // generation's run is reported, and the job deferred, never completed.
      deps.report(run, generation, result.log ?? run.log, result);
      return await failures.deferStoreFault(run, error);
    }
    if (!successor) return result;
    deps.report(run, generation, result.log ?? run.log, result);
    next = successor;
  }
}

/**
 * The job ran the key's last generation, which has ended, and nothing is pending (it is
 * delivered again after a crash or a fault past its commit): what that generation came to, read
 * from its key without claiming it (a key deleted after its retention would otherwise be
 * claimed anew and run a second time); `null` once the key is gone.
 */
async function replayEnded<P, M>(run: Run<P, M>, keys: IdempotencyKeys, key: string): Promise<RunResult> {
  const record = await keys.get(run.identity.scope, key);
  if (record?.status === 'failed') {
    return { outcome: { kind: 'replayed-failure', error: new KeyFailedError(record.scope, record.key, record.error) } };
  }
  return { outcome: { kind: 'replayed', result: record?.status === 'completed' ? record.result : null } };
}
