/**
 * The handler module of the deployed benchmark's `database-only` contender
 * (`idempotent-jobs worker --handler bench/support/deployed-database-only-handler.ts`, no
 * FAST_PATH or GROUP_COMMIT): the same one-row insert into SCHEMA's `bench_effects` as
 * deployed-handler.ts, in the database-only form `{ transaction }`, whose defaults are the fast
 * path and group commit.
 *
 * Like deployed-handler.ts it uses only Kysely's `sql` (through bench-handler.ts), nothing from
 * this checkout's library; a checkout whose CLI predates the form refuses the module at start.
 */
import type { Kysely } from 'kysely';
import { insertEffect, type BenchPayload } from './bench-handler.js';

const schema = process.env.SCHEMA ?? 'idempotent_jobs';
const worker = `pid-${process.pid}`;

export default {
  async transaction(tx: Kysely<any>, ctx: { readonly data: BenchPayload; readonly scope: string; readonly key: string }) {
    await insertEffect(tx, schema, ctx.scope, ctx.key, worker);
    return { n: ctx.data.n };
  },
};
