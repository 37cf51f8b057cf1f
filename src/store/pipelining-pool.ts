/**
 * Kysely over a node-postgres pool whose connections also answer pipeline queries (see
 * `pipeline.ts`). Kept apart from `create-postgres-db.ts` so that the public declaration files
 * never name `pg`'s types: `pg` ships none, and `@types/pg` is only a development dependency, so
 * a strict consumer without `skipLibCheck` would fail on them.
 */
import { Kysely, PostgresDialect, type PostgresPool, type PostgresPoolClient } from 'kysely';
import type pg from 'pg';
import { markPipelining, statementsOfPipeline, type PipelineReply } from './pipeline.js';
import { answerNamedQuery, answerPipelineQuery } from './pipeline-protocol.js';
import { preparedNameOf } from './named-statements.js';
import { PreparedStatementLostError, transientStoreFault } from './pg-errors.js';

const ROLLBACK = /^\s*rollback\s*;?\s*$/i;

/** Options of {@link kyselyOverPool}. */
export interface PipeliningPoolOptions {
  /**
   * Send the store's hot statements as named prepared statements, parsed once per connection
   * (see `named-statements.ts`). Turned off for good, for the whole pool, the first time a
   * connection finds one gone (a pooler in transaction mode that keeps none).
   * @defaultValue `true`
   */
  readonly preparedStatements?: boolean;
}

/**
 * A Kysely instance over an existing node-postgres pool whose connections send a pipeline query
 * as one pipeline (see `pipelines`): the store then sends BEGIN with a transaction's first
 * statement, a completion with its COMMIT, and a group's statements together, each in one round
 * trip.
 */
export function kyselyOverPool(pool: pg.Pool, options: PipeliningPoolOptions = {}): Kysely<any> {
  return markPipelining(new Kysely<any>({ dialect: new PostgresDialect({ pool: pipeliningPool(pool, options.preparedStatements ?? true) }) }));
}

/**
 * The pool as Kysely sees it, except that a pipeline query is sent as a pipeline, and a string of
 * several statements resolves with the last statement's result (node-postgres resolves with an
 * array of them, which Kysely would read as no rows). A single statement's result is untouched.
 * Exported for tests that put a pool of their own between Kysely and it (faults at a chosen
 * statement, `test/support/statement-faults.ts`); {@link kyselyOverPool} is the way in otherwise.
 */
export function pipeliningPool(pool: pg.Pool, preparedStatements: boolean): PostgresPool {
  let named = preparedStatements;
  return {
    async connect(): Promise<PostgresPoolClient> {
      const client = await pool.connect();
      let broken = false;
      // A session the server ended (57P01 as a statement's error, or the socket gone) is not
      // lent out again; nor is one that lost a prepared statement, and the pool stops naming them.
      const noteFault = (error: unknown) => {
        if (transientStoreFault(error) === 'connection') broken = true;
        if (error instanceof PreparedStatementLostError) named = false;
      };
      return {
        query: ((text: unknown, parameters?: readonly unknown[]) => {
          if (typeof text !== 'string') return client.query(text as any);
          if (statementsOfPipeline({ sql: text, parameters: parameters ?? [] })) {
            return answerPipelineQuery(client, text, parameters ?? [], { named }).then(
              (answer) => {
                const failure = (answer.rows[0] as PipelineReply).failure;
                if (failure) noteFault(failure.error);
                return answer;
              },
              (error: unknown) => {
                noteFault(error);
                throw error;
              },
            );
          }
          if (named && parameters && preparedNameOf(text) !== undefined) {
            return answerNamedQuery(client, text, parameters).catch((error: unknown) => {
              noteFault(error);
              throw error;
            });
          }
          const sent = client.query(text, parameters as unknown[]).then((result: pg.QueryResult | pg.QueryResult[]) =>
            Array.isArray(result) ? result[result.length - 1] : result,
          );
          if (!ROLLBACK.test(text)) return sent;
          // A ROLLBACK on a connection that broke fails with "Client has encountered a
          // connection error and is not queryable", and Kysely's `db.transaction()` would throw
          // that instead of the error that ended the transaction (the handler's own, or the
          // statement's 57P01). There is nothing left to roll back: the server aborts a
          // transaction whose session ends. So it counts as done, and the client is destroyed.
          return sent.catch((error: unknown) => {
            if (transientStoreFault(error) !== 'connection') throw error;
            broken = true;
            return { command: 'ROLLBACK', rowCount: null, rows: [] };
          });
        }) as PostgresPoolClient['query'],
        release: (destroy?: boolean) => client.release(destroy || broken),
      };
    },
    end: () => pool.end(),
  };
}
