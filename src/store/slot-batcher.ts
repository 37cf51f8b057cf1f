import type { Kysely } from 'kysely';
import { StatementBatcher } from './statement-batcher.js';
import { compareHeldSlots, releaseConcurrencySlot, releaseConcurrencySlots, type HeldSlot } from './sql/concurrency-slot-wakes.js';
import { acquireConcurrencySlot, acquireConcurrencySlots, compareSlotRequests, type SlotAnswer, type SlotRequest } from './sql/concurrency-slots.js';

type Settled<T> = { readonly value: T } | { readonly error: unknown };

/**
 * Group commit for concurrency slot rows (the leased path's slots), as {@link ClaimBatcher} is for
 * claims: the acquisitions (or releases) of one event-loop turn, and those that arrive while two
 * of their kind run, go out together, one statement and one commit for all
 * (`acquireConcurrencySlots`, `releaseConcurrencySlots`); a lone one goes out alone, with the
 * one-slot statement.
 * *Why:* a job with a concurrency key takes a slot before its claim and frees it after its run,
 * each a statement with a commit of its own, which cost as much as the claim and the completion
 * (see docs/benchmarks.md, Key features); jobs running at once take and free theirs at once.
 *
 * Each request keeps its own answer. A batch that failed as a whole (a deadlock, a dropped
 * connection) is sent again one request at a time, whose errors are the usual ones: a batch whose
 * commit landed and whose reply was lost leaves its slots taken under owners nobody holds, which
 * free when their time is up (the limit errs on the strict side, as for a lost reply alone), and
 * its releases already done, which the second try finds gone.
 *
 * [ClaimBatcher]: ./claim-batcher.ts
 */
export class SlotBatcher {
  readonly #db: Kysely<any>;
  readonly #schema: string;
  readonly #acquisitions: StatementBatcher<SlotRequest, Settled<SlotAnswer>>;
  readonly #releases: StatementBatcher<{ readonly slot: HeldSlot; readonly wakeAgainAfterMs: number }, Settled<boolean>>;

  constructor(db: Kysely<any>, schema: string) {
    this.#db = db;
    this.#schema = schema;
    this.#acquisitions = new StatementBatcher((requests) => this.#acquireAll(requests), { maxBatch: 64, maxInFlight: 2 });
    this.#releases = new StatementBatcher((requests) => this.#releaseAll(requests), { maxBatch: 64, maxInFlight: 2 });
  }

  /** Takes a slot for `request`'s run, or says when to ask again: alone, or in the next batch. */
  async acquire(request: SlotRequest): Promise<SlotAnswer> {
    return valueOf(await this.#acquisitions.submit(request));
  }

  /** Frees `slot` if its owner still holds it (false: it did not), waking a waiter: alone, or in the next batch. */
  async release(slot: HeldSlot, wakeAgainAfterMs: number): Promise<boolean> {
    return valueOf(await this.#releases.submit({ slot, wakeAgainAfterMs }));
  }

  async #acquireAll(requests: SlotRequest[]): Promise<Array<Settled<SlotAnswer>>> {
    const alone = (request: SlotRequest) => settle(() => acquireConcurrencySlot(this.#db, this.#schema, request));
    if (requests.length === 1) return [await alone(requests[0]!)];
    return inLockOrder(requests, compareSlotRequests, (sorted) => acquireConcurrencySlots(this.#db, this.#schema, sorted), alone);
  }

  async #releaseAll(requests: Array<{ readonly slot: HeldSlot; readonly wakeAgainAfterMs: number }>): Promise<Array<Settled<boolean>>> {
    const alone = ({ slot, wakeAgainAfterMs }: (typeof requests)[number]) =>
      settle(() => releaseConcurrencySlot(this.#db, this.#schema, slot.group, slot.slot, slot.owner, wakeAgainAfterMs));
    // One statement wakes waiters again after one interval: the rare request with another goes alone.
    const wakeAgainAfterMs = requests[0]!.wakeAgainAfterMs;
    if (requests.length === 1 || requests.some((r) => r.wakeAgainAfterMs !== wakeAgainAfterMs)) return Promise.all(requests.map(alone));
    return inLockOrder(
      requests,
      (a, b) => compareHeldSlots(a.slot, b.slot),
      (sorted) => releaseConcurrencySlots(this.#db, this.#schema, sorted.map((r) => r.slot), wakeAgainAfterMs),
      alone,
    );
  }
}

/**
 * Runs `batch` on `inputs` sorted by `compare` and hands each input its own answer, in the order
 * given; if the batch fails as a whole, each input goes `alone` instead (concurrently, as they
 * arrived).
 */
async function inLockOrder<I, O>(
  inputs: I[],
  compare: (a: I, b: I) => number,
  batch: (sorted: I[]) => Promise<O[]>,
  alone: (input: I) => Promise<Settled<O>>,
): Promise<Array<Settled<O>>> {
  const order = inputs.map((input, i) => ({ input, i })).sort((a, b) => compare(a.input, b.input));
  let answers: O[];
  try {
    answers = await batch(order.map((o) => o.input));
  } catch {
    return Promise.all(inputs.map(alone));
  }
  const out: Array<Settled<O>> = new Array(inputs.length);
  order.forEach(({ i }, position) => (out[i] = { value: answers[position]! }));
  return out;
}

async function settle<T>(call: () => Promise<T>): Promise<Settled<T>> {
  try {
    return { value: await call() };
  } catch (error) {
    return { error };
  }
}

function valueOf<T>(settled: Settled<T>): T {
  if ('error' in settled) throw settled.error;
  return settled.value;
}
