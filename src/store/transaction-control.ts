import { CompiledQuery, type Kysely, type QueryResult } from 'kysely';
import { prepared } from './named-statements.js';
import { sendStatements } from './pipeline.js';

/*
 * BEGIN, COMMIT and ROLLBACK of the transactions the store drives by hand (see
 * `../one-trip-commit.ts`). Each is one object: the store's connection wrappers let exactly these
 * through, and refuse a job's own statements that would end its transaction (see
 * `../statement-screen.ts`).
 */

/**
 * The BEGIN of every transaction the store drives by hand: isolation pinned to read committed,
 * so a server or role whose `default_transaction_isolation` is stricter does not turn concurrent
 * duplicates into serialization failures.
 */
export const BEGIN_READ_COMMITTED = prepared(CompiledQuery.raw('begin isolation level read committed'));

/** A plain BEGIN, for a held step record's own short transaction. */
export const BEGIN = CompiledQuery.raw('begin');

export const COMMIT = prepared(CompiledQuery.raw('commit'));

export const ROLLBACK = CompiledQuery.raw('rollback');

const STORE_CONTROL = new Set<CompiledQuery>([BEGIN_READ_COMMITTED, BEGIN, COMMIT, ROLLBACK]);

/** True for the store's own BEGIN, COMMIT and ROLLBACK (never a job's). */
export function isStoreTransactionControl(query: CompiledQuery): boolean {
  return STORE_CONTROL.has(query);
}

/**
 * True when a COMMIT's result says it committed. Postgres answers COMMIT in a transaction that
 * an earlier failed statement aborted (one the effect caught and swallowed) with ROLLBACK, and no
 * error: nothing was kept.
 */
export function commitApplied(result: QueryResult<unknown> | undefined): boolean {
  return (result?.rows[0] as { command?: unknown } | undefined)?.command !== 'ROLLBACK';
}

/**
 * A transaction that could not commit because a statement of it had failed earlier (and was
 * caught): Postgres rolled it back at COMMIT. SQLSTATE 25P02, as Postgres reports every statement
 * of such a transaction.
 */
export class AbortedTransactionError extends Error {
  readonly code = '25P02';

  constructor() {
    super('the transaction was rolled back at COMMIT: a statement of it had failed earlier (and its error was caught), so nothing of it was kept');
    this.name = 'AbortedTransactionError';
  }
}

/** COMMIT on its own, for a transaction with nothing left to write; throws when Postgres rolled it back instead. */
export async function commitTransaction(tx: Kysely<any>): Promise<void> {
  const reply = await sendStatements(tx, [COMMIT]);
  if (reply.failure) throw reply.failure.error;
  if (!commitApplied(reply.results[0])) throw new AbortedTransactionError();
}

/**
 * ROLLBACK. After a failed final `…; commit` there is no transaction left and Postgres only
 * warns, so this is safe to send whatever state the transaction is in.
 */
export async function rollbackTransaction(tx: Kysely<any>): Promise<void> {
  const reply = await sendStatements(tx, [ROLLBACK]);
  if (reply.failure) throw reply.failure.error;
}
