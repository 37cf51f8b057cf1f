import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { ReadOnlyStoreError } from '../errors.js';
import { PostgresOperatorStore, type ServerRole } from '../store/operator-store.js';
import { isTransientStoreError } from '../store/pg-errors.js';
import { redactedUrl, type DatabaseSetting } from './database-problems.js';
import { StoreUnreachableAtStartError, waitForStore } from './wait-for-store.js';

/**
 * The start-up check of a process's Postgres: a server that takes no writes (a standby, a
 * read-only setting) is refused with a {@link ReadOnlyStoreError} naming the variable and the
 * fix, before migrations or a claim could meet 25006 on it; a primary that acknowledges commits
 * without a synchronous standby while standbys stream from it gets a warning (see
 * {@link acknowledgesWithoutStandby}). Transient faults reach the caller as they are, so the
 * start's wait for Postgres (`waitForStore`) tries again; so may a standby
 * ({@link worthWaitingAtStart}).
 */
export async function checkWritableStore(db: Kysely<any>, setting: Omit<DatabaseSetting, 'schema'>, logger: Logger): Promise<ServerRole> {
  const role = await new PostgresOperatorStore(db, 'public').serverRole();
  if (role.inRecovery || role.transactionReadOnly) {
    throw new ReadOnlyStoreError({ variable: setting.variable, url: redactedUrl(setting.url), inRecovery: role.inRecovery });
  }
  if (acknowledgesWithoutStandby(role)) {
    logger.warn(
      { variable: setting.variable, replicas: role.replicas, synchronousStandbyNames: role.synchronousStandbyNames, synchronousCommit: role.synchronousCommit },
      `Postgres (${setting.variable}) acknowledges commits before any standby has them, while ${role.replicas} standby(s) stream from it: ` +
        'a failover to one of them can lose acknowledged commits, and with them keys and effects of jobs BullMQ already recorded as completed. ' +
        'Set synchronous_standby_names (e.g. ANY 1 (*)) with synchronous_commit = on, or your managed service\'s synchronous mode; see docs/operations.md, "Postgres failover and replicas"',
    );
  }
  return role;
}

/**
 * True when a commit is acknowledged before a standby confirmed it although standbys exist:
 * no `synchronous_standby_names`, or `synchronous_commit` at `off` or `local`. Without any
 * standby there is nothing a failover could promote, and so nothing to warn about.
 */
export function acknowledgesWithoutStandby(role: ServerRole): boolean {
  if (role.replicas === 0) return false;
  return role.synchronousStandbyNames.trim() === '' || role.synchronousCommit === 'off' || role.synchronousCommit === 'local';
}

/**
 * Whether a start may wait for `error` to pass: a transient fault, or a standby. A URL that
 * reaches a standby during a failover (the demoted primary, before HAProxy or DNS moved) takes
 * writes again seconds later; one that names a reader endpoint never does, and the start ends
 * with the {@link ReadOnlyStoreError} at its deadline ({@link startFailure}). A read-only
 * setting is no failover: it is refused at once.
 */
export function worthWaitingAtStart(error: unknown): boolean {
  return isTransientStoreError(error) || (error instanceof ReadOnlyStoreError && error.inRecovery);
}

/** The error a start that gave up reports: the {@link ReadOnlyStoreError} itself when a standby was what it waited out. */
export function startFailure(error: unknown): unknown {
  return error instanceof StoreUnreachableAtStartError && error.cause instanceof ReadOnlyStoreError ? error.cause : error;
}

/**
 * {@link checkWritableStore} until it passes or `deadline` (in `Date.now()` time): for a
 * process whose start does nothing else with Postgres before it serves (HTTP, relay,
 * maintenance).
 */
export async function waitForWritableStore(db: Kysely<any>, setting: Omit<DatabaseSetting, 'schema'>, logger: Logger, deadline: number): Promise<ServerRole> {
  return waitForStore(() => checkWritableStore(db, setting, logger), { what: `Postgres (${setting.variable})`, deadline, logger, retryable: worthWaitingAtStart }).catch(
    (error: unknown) => {
      throw startFailure(error);
    },
  );
}
