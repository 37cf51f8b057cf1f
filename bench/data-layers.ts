/**
 * `npm run bench:data-layers`: what an effect written in your own data layer costs, against the
 * same one-row effect through Kysely and against the lean baseline (see
 * bench/support/data-layers.ts for the method). `npm run bench` runs the same rows, smaller, in
 * its data-layers section.
 *
 * Usage: `tsx bench/data-layers.ts [jobs] [rounds]` (defaults 1000 and 3). Needs Postgres at
 * DATABASE_URL.
 */
import { formatDataLayersTable, runDataLayersBench } from './support/data-layers.js';

const [jobs = 1000, rounds = 3] = process.argv.slice(2).map(Number);
const run = await runDataLayersBench({ jobs, rounds, databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres' });
console.log(formatDataLayersTable(run));
