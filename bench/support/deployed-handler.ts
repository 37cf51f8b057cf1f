/**
 * The handler module the deployed benchmark gives the CLI worker
 * (`idempotent-jobs worker --handler bench/support/deployed-handler.ts`): the benchmark's
 * one-row insert in `ctx.transaction`, into SCHEMA's `bench_effects`.
 *
 * It is also loaded by the CLI of another checkout (bench/deployed-ab.ts), which may predate
 * this file: so it uses only `ctx` and Kysely's `sql` (through bench-handler.ts), nothing else
 * from this checkout's library.
 */
import { benchHandler } from './bench-handler.js';

export default benchHandler(process.env.SCHEMA ?? 'idempotent_jobs', `pid-${process.pid}`);
