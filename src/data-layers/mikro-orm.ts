import type { EntityManager, IsolationLevel, TransactionOptions, TransactionPropagation } from '@mikro-orm/core';
import type { Knex } from 'knex';
import { ValidationError } from '../errors.js';
import type { DataLayer } from '../store/data-layer.js';
import { AbortedTransactionError } from '../store/transaction-control.js';
import { unwrapDriverError } from './driver-error.js';
import { commitCommandOf, knexStatementsOn } from './knex.js';
import { optionNames, refuseUnknownOptions } from '../config/unknown-options.js';

/** Options of {@link mikroOrmDataLayer}. */
export interface MikroOrmDataLayerOptions {
  /** How errors name the data layer. @defaultValue `'MikroORM'` */
  readonly name?: string;
}

/**
 * MikroORM's transaction options, by value: `IsolationLevel.READ_COMMITTED` and
 * `TransactionPropagation.REQUIRES_NEW` are these strings, written here so that the adapter
 * imports nothing of MikroORM at run time.
 */
const TRANSACTION_OPTIONS: TransactionOptions = {
  isolationLevel: 'read committed' as IsolationLevel,
  // A transaction of its own even when the caller's context holds one (MikroORM's default,
  // NESTED, would make it a savepoint, and the key's completion would commit with the outer
  // transaction, or not at all).
  propagation: 'requires_new' as TransactionPropagation,
};

/**
 * Your MikroORM entity manager (`@mikro-orm/postgresql`) as a data layer: the effect runs in
 * `em.transactional(fn, { isolationLevel: READ_COMMITTED, propagation: REQUIRES_NEW })` on its
 * fork, and the key's fenced completion runs last in it, on the Knex transaction underneath
 * (`trx.raw`). MikroORM flushes what the effect persisted before it commits, in the same
 * transaction.
 *
 * MikroORM commits through Knex, which takes a COMMIT that Postgres answered with ROLLBACK (a
 * statement of the transaction failed earlier and its error was caught) as committed: the
 * adapter reads that answer and rejects.
 *
 * @example
 * ```ts
 * import { EntitySchema, MikroORM } from '@mikro-orm/postgresql';
 * import { databaseOnly, type DatabaseOnlyContext } from 'idempotent-jobs';
 * import { mikroOrmDataLayer } from 'idempotent-jobs/mikro-orm';
 *
 * const Ledger = new EntitySchema<{ orderId: number; cents: number }>({
 *   name: 'Ledger',
 *   properties: { orderId: { type: 'number', primary: true }, cents: { type: 'number' } },
 * });
 * const orm = await MikroORM.init({ clientUrl: process.env.DATABASE_URL, entities: [Ledger] });
 *
 * export default databaseOnly(mikroOrmDataLayer(orm.em), async (em, ctx: DatabaseOnlyContext<{ orderId: number; cents: number }>) => {
 *   em.persist(em.create(Ledger, { orderId: ctx.data.orderId, cents: ctx.data.cents }));
 *   return { booked: true };
 * });
 * ```
 */
export function mikroOrmDataLayer<E extends EntityManager>(em: E, options: MikroOrmDataLayerOptions = {}): DataLayer<E> {
  refuseUnknownOptions(options, optionNames<MikroOrmDataLayerOptions>()(['name']), 'mikroOrmDataLayer(em, options)');
  const name = options.name ?? 'MikroORM';
  return {
    name,
    async transaction(body) {
      let committed: PromiseLike<unknown> | undefined;
      const value = await em.transactional(async (fork) => {
        const trx = knexTransactionOf(fork, name);
        // MikroORM commits with `trx.commit()` and keeps only whether it threw: the reply,
        // whose command tag says COMMIT or ROLLBACK, is kept here.
        const commit = trx.commit.bind(trx);
        trx.commit = (value?: unknown) => {
          const reply = commit(value);
          committed = reply;
          return reply;
        };
        return body(fork, knexStatementsOn(trx));
      }, TRANSACTION_OPTIONS);
      // Postgres answers COMMIT in an aborted transaction with ROLLBACK, and no error.
      if (commitCommandOf(await committed) === 'ROLLBACK') throw new AbortedTransactionError();
      return value;
    },
    driverError: unwrapDriverError,
    statementsOn: (fork) => knexStatementsOn(knexTransactionOf(fork, name)),
  };
}

/** The Knex transaction under an entity manager's open transaction. */
function knexTransactionOf(em: EntityManager, name: string): Knex.Transaction {
  const trx = em.getTransactionContext<Knex.Transaction>();
  if (trx === undefined || typeof (trx as { raw?: unknown }).raw !== 'function') {
    throw new ValidationError(
      'INVALID_OPTIONS',
      'dataLayer',
      `The ${name} data layer needs an entity manager inside a transaction of an SQL driver (@mikro-orm/postgresql): call it inside em.transactional(…).`,
    );
  }
  return trx;
}
