import { sql, type Kysely } from 'kysely';

/**
 * What a Postgres server will do with a write, and how it acknowledges one: read before a
 * process starts claiming, because a claim on a standby (a reader endpoint, a URL left on a
 * demoted primary) would only ever meet 25006, and a commit acknowledged without a synchronous
 * standby can vanish in a failover.
 */
export interface ServerRole {
  /** `pg_is_in_recovery()`: a standby (streaming replica, reader endpoint), which takes no writes. */
  readonly inRecovery: boolean;
  /**
   * `transaction_read_only` of a transaction begun the usual way: on for a standby, and for a
   * primary whose `default_transaction_read_only` is on (a database, role or server setting).
   */
  readonly transactionReadOnly: boolean;
  /** `default_transaction_read_only`: the setting that makes a primary refuse writes. */
  readonly defaultTransactionReadOnly: boolean;
  /** `synchronous_standby_names`: empty when no standby has to confirm a commit. */
  readonly synchronousStandbyNames: string;
  /** `synchronous_commit` as this connection reads it: `off` or `local` acknowledge before any standby has the commit. */
  readonly synchronousCommit: string;
  /** Standbys streaming from this server now (`pg_stat_replication`, which any role may count). */
  readonly replicas: number;
}

/** One round trip: the settings and state of {@link ServerRole}. */
export async function serverRole(db: Kysely<any>): Promise<ServerRole> {
  const { rows } = await sql<{
    in_recovery: boolean;
    transaction_read_only: string;
    default_transaction_read_only: string;
    synchronous_standby_names: string;
    synchronous_commit: string;
    replicas: number;
  }>`
    select pg_is_in_recovery() as in_recovery,
           current_setting('transaction_read_only') as transaction_read_only,
           current_setting('default_transaction_read_only') as default_transaction_read_only,
           current_setting('synchronous_standby_names') as synchronous_standby_names,
           current_setting('synchronous_commit') as synchronous_commit,
           (select count(*) from pg_stat_replication)::int as replicas
  `.execute(db);
  const row = rows[0]!;
  return {
    inRecovery: row.in_recovery,
    transactionReadOnly: row.transaction_read_only === 'on',
    defaultTransactionReadOnly: row.default_transaction_read_only === 'on',
    synchronousStandbyNames: row.synchronous_standby_names,
    synchronousCommit: row.synchronous_commit,
    replicas: row.replicas,
  };
}
