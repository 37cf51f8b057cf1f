import type { Kysely } from 'kysely';
import type { ClaimOutcome } from './claim-outcome.js';
import { claimKeysBatch } from './sql/claim-batch.js';
import { claimKey, classifyClaimRow } from './sql/claim.js';
import { compareLockOrder } from './lock-order.js';
import { StatementBatcher } from './statement-batcher.js';
import type { ClaimStatementInput } from './records.js';

type ClaimResult = { readonly outcome: ClaimOutcome } | { readonly error: unknown };

/**
 * Group commit for leased claims, over a {@link StatementBatcher}: the claims of one event-loop
 * turn, and those that arrive while two claim statements run, go out together as one
 * `claim_keys` statement: one round trip and one commit for all of them; a lone claim goes out
 * alone, with `claim_key`. Two may
 * run at once so that a batch stuck on one key's lock wait (a fast-path transaction holding it,
 * bounded by `lock_timeout`) does not hold up every claim.
 *
 * Each claim keeps its own outcome. Inputs that need another look (see `classifyClaimRow`), and
 * every input of a batch that failed as a whole (a `lock_timeout` on one key, a deadlock, a
 * dropped connection), are claimed again alone with the single-key statement, whose errors and
 * retries are the usual ones. Each input keeps its owner token for that: when the batch did
 * commit and only its reply was lost, `claim_key` finds the row held under the input's own
 * token and returns it as this claim's (same fence), instead of another owner's key in progress.
 */
export class ClaimBatcher {
  readonly #db: Kysely<any>;
  readonly #schema: string;
  readonly #batcher: StatementBatcher<ClaimStatementInput, ClaimResult>;

  constructor(db: Kysely<any>, schema: string) {
    this.#db = db;
    this.#schema = schema;
    this.#batcher = new StatementBatcher((inputs) => this.#claimAll(inputs), { maxBatch: 64, maxInFlight: 2 });
  }

  /** Claims `input` (a `'lease'` claim), alone or in the next batch. */
  async claim(input: ClaimStatementInput): Promise<ClaimOutcome> {
    const settled = await this.#batcher.submit(input);
    if ('error' in settled) throw settled.error;
    return settled.outcome;
  }

  async #claimAll(inputs: ClaimStatementInput[]): Promise<ClaimResult[]> {
    if (inputs.length === 1) return [await this.#claimAlone(inputs[0]!)];
    // One lock order for every batch: two batches sharing keys cannot deadlock.
    const order = inputs.map((input, i) => ({ input, i })).sort((a, b) => compareLockOrder(a.input, b.input));
    let rows;
    try {
      rows = await claimKeysBatch(this.#db, this.#schema, order.map((o) => o.input));
    } catch {
      // Nothing of the batch committed: claim each key alone (concurrently, as they arrived).
      return Promise.all(inputs.map((input) => this.#claimAlone(input)));
    }
    const byIndex = new Map(rows.map((row) => [row.idx, row]));
    const out: ClaimResult[] = new Array(inputs.length);
    await Promise.all(
      order.map(async ({ input, i }, position) => {
        const outcome = classifyClaimRow(input, byIndex.get(position + 1));
        out[i] = outcome === 'again' ? await this.#claimAlone(input) : { outcome };
      }),
    );
    return out;
  }

  async #claimAlone(input: ClaimStatementInput): Promise<ClaimResult> {
    try {
      return { outcome: await claimKey(this.#db, input) };
    } catch (error) {
      return { error };
    }
  }
}
