import { TransactionControlError } from '../errors.js';
import { counter } from '../metric-registry.js';
import { StateLeftBehind, StatementLeavesState } from '../store/gathering-connection.js';

/**
 * Why group commit sent a job out of its group to run alone, for what it does to the shared
 * transaction:
 * - `statement-leaves-state`: it sent a statement whose text leaves state (`SET`, `set_config`,
 *   `CREATE TEMP`, …; see `store/statement-screen.ts`);
 * - `transaction-control`: it sent a statement that would end the transaction (COMMIT, …);
 * - `state-left-behind`: the check after its statements found state it left (a setting changed
 *   inside a function, a temporary table, an open cursor, a prepared statement, a savepoint);
 * - `slots-held-too-long`: it held its concurrency slots by the group's transaction past
 *   `slowJobMs` (its kind runs alone for a while: `GroupCommitter`).
 */
export type GroupRefusalReason = 'statement-leaves-state' | 'transaction-control' | 'state-left-behind' | 'slots-held-too-long';

/** A job group commit sent out of its group: why, and what it was told. */
export interface GroupRefusal {
  /** What the job did to the shared transaction. */
  readonly reason: GroupRefusalReason;
  /** The error that says what the job did. */
  readonly error: Error;
  /** The job's kind (queue and job name), whose later jobs now run alone from the start; undefined for a job of no kind. */
  readonly kind: string | undefined;
}

/** The reason `error` (a culprit's, in a group that rolled back) is a refusal, or undefined when it is the job's own failure. */
export function refusalReasonOf(error: unknown): GroupRefusalReason | undefined {
  if (error instanceof StatementLeavesState) return 'statement-leaves-state';
  if (error instanceof TransactionControlError) return 'transaction-control';
  if (error instanceof StateLeftBehind) return 'state-left-behind';
  return undefined;
}

const REASONS: readonly GroupRefusalReason[] = ['statement-leaves-state', 'transaction-control', 'state-left-behind', 'slots-held-too-long'];

/**
 * `idempotent_jobs_group_commit_refusals_total{reason}`, created on first use in the default
 * registry, every reason's series at zero from the start (so that an alert sees the first one).
 */
export function groupRefusalsCounter() {
  const refusals = counter(
    'group_commit_refusals_total',
    'Jobs group commit sent out of their group to run alone for what they did to the shared transaction, by reason: statement-leaves-state (a SET, set_config, CREATE TEMP… in its text), transaction-control (a COMMIT, ROLLBACK… in its text), state-left-behind (the check after its statements found a setting changed, a temporary object, an open cursor, a prepared statement or a savepoint it left), slots-held-too-long (it held its concurrency slots by the group\'s transaction past slowJobMs: the group waited for it). Each rolls its group back once; later jobs of its kind (queue and job name) run alone from the start (for five minutes after slots-held-too-long).',
    ['reason'],
  );
  for (const reason of REASONS) refusals.inc({ reason }, 0);
  return refusals;
}
