import {
  DummyDriver,
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  SingleConnectionProvider,
  type CompiledQuery,
  type DatabaseConnection,
  type QueryResult,
  type Transaction,
} from 'kysely';
import { DataLayerElsewhereError } from '../errors.js';
import type { DataLayer, RunStatement } from './data-layer.js';
import { transactionOn } from './one-trip-commit.js';
import { databaseIdentityStatement, type DatabaseIdentity } from './sql/database-identity.js';

/**
 * Runs `body` inside a transaction of the user's data layer: `bridge` is a Kysely `Transaction`
 * whose statements go through the data layer's raw-SQL call into that same transaction, so every
 * statement of the store (the claim, the fenced completion, the fast path's result) runs there
 * unchanged; `tx` is the data layer's own transaction object, for the effect. The data layer
 * begins (read committed), commits and rolls back; the store sends no BEGIN, COMMIT or ROLLBACK.
 *
 * Before the first body of each data layer runs, the transaction is checked to be on the keys'
 * server and database and to see their table ({@link DataLayerElsewhereError} otherwise):
 * one statement, once per data layer and schema.
 *
 * Errors of the bridge's statements are thrown as the driver's own (`DataLayer.driverError`), so
 * the store reads their SQLSTATE as it reads node-postgres's.
 */
export async function runInDataLayer<Tx, T>(
  db: Kysely<any>,
  schema: string,
  layer: DataLayer<Tx>,
  body: (bridge: Transaction<any>, tx: Tx) => Promise<T>,
): Promise<T> {
  const bridgeOn = (run: RunStatement) => transactionOn(db, new SingleConnectionProvider(new DataLayerConnection(run, (error) => layer.driverError(error))), false);
  if (checkedLayers.get(layer)?.has(schema)) return layer.transaction((tx, run) => body(bridgeOn(run), tx));
  // The keys' side is read before the data layer's transaction opens, never inside it: a read on
  // another connection while the transaction holds one deadlocks a pool (or a PgBouncer entry)
  // whose connections are all held by such transactions.
  const ours = await keysIdentity(db, schema);
  let elsewhere: DatabaseIdentity | undefined;
  try {
    return await layer.transaction(async (tx, run) => {
      const bridge = bridgeOn(run);
      const theirs = await readIdentity(bridge, schema);
      if (whyElsewhere(theirs, ours, schema)) {
        elsewhere = theirs;
        throw NOT_CHECKED;
      }
      markChecked(layer, schema);
      return body(bridge, tx);
    });
  } catch (error) {
    if (!elsewhere) throw error;
  }
  // Refused against the keys' side as read once, maybe before a restart or a failover: read it
  // again (outside any transaction) before refusing; the body has not run, so it may run now.
  await refuseElsewhere(db, schema, layer, elsewhere);
  return layer.transaction((tx, run) => body(bridgeOn(run), tx));
}

/**
 * Checks, in one transaction of `layer`, that it is on the keys' server and database and sees
 * their table ({@link DataLayerElsewhereError} otherwise), and remembers the answer as the first
 * body's check does: what a worker runs at start for the data layers it is given. A transient
 * fault rejects with the driver's error, as a statement of the store's would.
 */
export async function checkDataLayer(db: Kysely<any>, schema: string, layer: DataLayer<unknown>): Promise<void> {
  const ours = await keysIdentity(db, schema);
  const theirs = await layer.transaction((_tx, run) =>
    readIdentity(transactionOn(db, new SingleConnectionProvider(new DataLayerConnection(run, (error) => layer.driverError(error))), false), schema),
  );
  if (whyElsewhere(theirs, ours, schema)) await refuseElsewhere(db, schema, layer, theirs);
  else markChecked(layer, schema);
}

/** Thrown inside a first transaction found elsewhere, to roll it back before the keys' side is read again. */
const NOT_CHECKED = new Error('the data layer is not on the keys\' database as last read: rolled back');

/** A Kysely instance that only compiles (Postgres's dialect, no driver): for {@link kyselyOn}. */
const COMPILING_ONLY = new Kysely<any>({
  dialect: {
    createAdapter: () => new PostgresAdapter(),
    createDriver: () => new DummyDriver(),
    createIntrospector: (db) => new PostgresIntrospector(db),
    createQueryCompiler: () => new PostgresQueryCompiler(),
  },
});

/**
 * A Kysely `Transaction` whose statements go through `run` into a transaction the user opened
 * in their data layer (see `DataLayer.statementsOn`): the outbox's insert, say, commits or rolls
 * back with the user's own writes. It sends no BEGIN, COMMIT or ROLLBACK.
 */
export function kyselyOn(run: RunStatement, driverError: (error: unknown) => unknown): Transaction<any> {
  return transactionOn(COMPILING_ONLY, new SingleConnectionProvider(new DataLayerConnection(run, driverError)), false);
}

/** A Kysely connection over a data layer's raw-SQL call inside its open transaction. */
class DataLayerConnection implements DatabaseConnection {
  readonly #run: RunStatement;
  readonly #driverError: (error: unknown) => unknown;

  constructor(run: RunStatement, driverError: (error: unknown) => unknown) {
    this.#run = run;
    this.#driverError = driverError;
  }

  async executeQuery<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    try {
      const { rows } = await this.#run(query.sql, query.parameters);
      return { rows: rows as R[] };
    } catch (error) {
      throw this.#driverError(error);
    }
  }

  // eslint-disable-next-line require-yield
  async *streamQuery<R>(): AsyncIterableIterator<QueryResult<R>> {
    throw new Error('streaming is not available on a data layer\'s transaction');
  }
}

/** Data layers (and the schemas of their keys) whose transactions were found on the keys' database. */
const checkedLayers = new WeakMap<object, Set<string>>();
/** The keys' side of the check, read once per store instance and schema. */
const keysIdentities = new WeakMap<Kysely<any>, Map<string, Promise<DatabaseIdentity>>>();

/** The data layer's side of the check: one statement in its transaction. */
async function readIdentity(bridge: Transaction<any>, schema: string): Promise<DatabaseIdentity> {
  return (await bridge.executeQuery<DatabaseIdentity>(databaseIdentityStatement(schema))).rows[0]!;
}

function markChecked(layer: DataLayer<unknown>, schema: string): void {
  let schemas = checkedLayers.get(layer);
  if (!schemas) checkedLayers.set(layer, (schemas = new Set()));
  schemas.add(schema);
}

/**
 * Refuses a data layer whose transaction is on another server or database than the keys, or
 * cannot see their table: the effect would commit in one database and the key in another, the
 * very gap the library closes. A pool of its own to the same database (PgBouncer included) is
 * fine. `theirs` was found elsewhere against the keys' side as read earlier: read afresh first,
 * and only refused if it still differs.
 */
async function refuseElsewhere(db: Kysely<any>, schema: string, layer: DataLayer<unknown>, theirs: DatabaseIdentity): Promise<void> {
  const reason = whyElsewhere(theirs, await keysIdentity(db, schema, { fresh: true }), schema);
  if (reason) throw new DataLayerElsewhereError(layer.name, reason);
  markChecked(layer, schema);
}

function keysIdentity(db: Kysely<any>, schema: string, options: { fresh?: boolean } = {}): Promise<DatabaseIdentity> {
  let bySchema = keysIdentities.get(db);
  if (!bySchema) keysIdentities.set(db, (bySchema = new Map()));
  let identity = options.fresh ? undefined : bySchema.get(schema);
  if (!identity) {
    identity = db.executeQuery<DatabaseIdentity>(databaseIdentityStatement(schema)).then((r) => r.rows[0]!);
    // A failed read is not kept: the next job asks again.
    identity.catch(() => bySchema.delete(schema));
    bySchema.set(schema, identity);
  }
  return identity;
}

/** Why `theirs` (the data layer's transaction) is not where `ours` (the keys) is; undefined when it is. */
export function whyElsewhere(theirs: DatabaseIdentity, ours: DatabaseIdentity, schema: string): string | undefined {
  const table = `"${schema}".idempotency_keys`;
  // The system identifier names the cluster and outlives restarts and failovers (a standby shares
  // its primary's); where the role cannot read it, the server's start time stands in.
  const sameServer =
    theirs.system_identifier !== null && ours.system_identifier !== null ? theirs.system_identifier === ours.system_identifier : theirs.started_at === ours.started_at;
  if (!sameServer) return `its connection reaches another Postgres server than the keys' (database "${theirs.database}" there, "${ours.database}" for the keys)`;
  if (theirs.database_oid !== ours.database_oid) return `its connection is on database "${theirs.database}", the keys are in database "${ours.database}"`;
  if (theirs.keys_table === null) return `the keys' table ${table} does not exist or cannot be seen from its connection`;
  if (theirs.keys_table !== ours.keys_table) return `its ${table} is another table than the keys'`;
  return undefined;
}
