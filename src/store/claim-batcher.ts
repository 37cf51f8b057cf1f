import type { Kysely } from 'kysely';
import type { ClaimOutcome } from './claim-outcome.js';
import { claimKeysBatch } from './sql/claim-batch.js';
import { claimKey, classifyClaimRow, type ClaimStatementInput } from './sql/claim.js';

interface Pending {
  readonly input: ClaimStatementInput;
  readonly resolve: (outcome: ClaimOutcome) => void;
  readonly reject: (error: unknown) => void;
}

/** Largest batch: bounds the statement and the time one slow key holds the others. */
const MAX_BATCH = 64;
/**
 * Claim statements running at once. Two, so that a batch stuck on one key's lock wait (a
 * fast-path transaction holding it, bounded by `lock_timeout`) does not hold up every claim.
 */
const MAX_IN_FLIGHT = 2;

/**
 * Group commit for leased claims. A claim that arrives while fewer than two claim statements
 * are running goes out at once (so a lone claim costs what it always did). Claims that arrive
 * while two are running wait for one of them and then go out together: one statement, one round trip and one commit for all of them
 * (`claim_keys`). Under load, concurrent jobs' claims batch themselves; nothing waits on a timer.
 *
 * Each claim keeps its own outcome. Inputs that need another look (see `classifyClaimRow`), and
 * every input of a batch that failed as a whole (a `lock_timeout` on one key, a deadlock, a
 * dropped connection), are claimed again alone with the single-key statement, whose errors and
 * retries are the usual ones.
 */
export class ClaimBatcher {
  readonly #db: Kysely<any>;
  readonly #schema: string;
  #queue: Pending[] = [];
  #running = 0;

  constructor(db: Kysely<any>, schema: string) {
    this.#db = db;
    this.#schema = schema;
  }

  /** Claims `input` (a `'lease'` claim), alone or in the next batch. */
  claim(input: ClaimStatementInput): Promise<ClaimOutcome> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ input, resolve, reject });
      if (this.#running < MAX_IN_FLIGHT) void this.#drain();
    });
  }

  async #drain(): Promise<void> {
    this.#running++;
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, MAX_BATCH);
        await (batch.length === 1 ? this.#claimAlone(batch[0]!) : this.#claimBatch(batch));
      }
    } finally {
      this.#running--;
    }
  }

  async #claimAlone(pending: Pending): Promise<void> {
    try {
      pending.resolve(await claimKey(this.#db, pending.input));
    } catch (error) {
      pending.reject(error);
    }
  }

  async #claimBatch(batch: Pending[]): Promise<void> {
    // One lock order for every batch: two batches sharing keys cannot deadlock.
    batch.sort((a, b) => compare(a.input.scope, b.input.scope) || compare(a.input.key, b.input.key));
    let rows;
    try {
      rows = await claimKeysBatch(this.#db, this.#schema, batch.map((p) => p.input));
    } catch {
      // Nothing of the batch committed: claim each key alone (concurrently, as they arrived).
      await Promise.all(batch.map((pending) => this.#claimAlone(pending)));
      return;
    }
    const again: Pending[] = [];
    batch.forEach((pending, i) => {
      const outcome = classifyClaimRow(pending.input, rows.find((row) => row.idx === i + 1));
      if (outcome === 'again') again.push(pending);
      else pending.resolve(outcome);
    });
    await Promise.all(again.map((pending) => this.#claimAlone(pending)));
  }
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
