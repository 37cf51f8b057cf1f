/**
 * `npm run bench:http-idempotency`: what the HTTP idempotency middleware costs an endpoint. The
 * same order endpoint (one order row and its job's outbox row in one transaction) is served by
 * one process three ways: without the middleware, with it (a function handler: the key claimed
 * under a lease, then the transaction that completes it), and with it database-only (the key
 * claimed inside the transaction). A closed-loop load generator in this process keeps
 * `connections` requests in flight (keep-alive, each POST with a new Idempotency-Key) for
 * `seconds` per variant, the variants alternated in each round, their order rotated; it reports
 * each variant's requests per second and p99 latency (median over the rounds) and their ratio to
 * the endpoint without the middleware in the same run.
 *
 * Usage: `tsx bench/http-idempotency.ts [seconds] [rounds] [connections]` (defaults 10, 3, 16).
 * Needs Postgres at DATABASE_URL and Redis at REDIS_URL (the producer's queue; nothing is sent
 * to it). Creates and drops a schema of its own.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { Agent, request } from 'node:http';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { createPostgresDb, migrate } from 'idempotent-jobs';
import { formatSpread, percentile, spread, type Spread } from './support/stats.js';

const [seconds = 10, rounds = 3, connections = 16] = process.argv.slice(2).map(Number);
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomBytes(4).toString('hex');
const schema = `bench_http_${run}`;

const VARIANTS = [
  { name: 'without the middleware', path: '/plain/orders' },
  { name: 'middleware, function handler (leased)', path: '/orders' },
  { name: 'middleware, database-only (fast path)', path: '/fast-orders' },
] as const;

interface Measurement {
  readonly requestsPerSecond: number;
  readonly p99Ms: number;
  readonly errors: number;
}

/** Keeps `connections` POSTs in flight for `seconds`; each with a new key. Counts non-201 answers as errors. */
async function load(url: string, path: string, label: string): Promise<Measurement> {
  const { hostname, port } = new URL(url);
  const agent = new Agent({ keepAlive: true, maxSockets: connections });
  const latencies: number[] = [];
  let errors = 0;
  const until = performance.now() + seconds * 1000;
  const worker = async (index: number) => {
    for (let n = 0; performance.now() < until; n++) {
      const started = performance.now();
      const status = await new Promise<number>((resolve) => {
        const req = request(
          { host: hostname, port, path, method: 'POST', agent, headers: { 'content-type': 'application/json', 'idempotency-key': `${label}-${run}-${index}-${n}` } },
          (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode ?? 0));
          },
        );
        req.on('error', () => resolve(0));
        req.end('{"cents":1999}');
      });
      latencies.push(performance.now() - started);
      if (status !== 201) errors++;
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: connections }, (_, index) => worker(index)));
  const elapsed = (performance.now() - started) / 1000;
  agent.destroy();
  latencies.sort((a, b) => a - b);
  return { requestsPerSecond: latencies.length / elapsed, p99Ms: percentile(latencies, 99), errors };
}

const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 2 }, () => {});
await migrate(db, { schema });
await sql`create table ${sql.id(schema, 'orders')} (id text primary key, cents integer not null)`.execute(db);
const server = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('./support/http-idempotency-server.ts', import.meta.url))], {
  env: { ...process.env, DATABASE_URL: databaseUrl, REDIS_URL: redisUrl, SCHEMA: schema, REDIS_PREFIX: `bench-http-${run}` },
  stdio: ['ignore', 'pipe', 'inherit'],
});
try {
  const url = await new Promise<string>((resolve, reject) => {
    let output = '';
    server.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      const match = /listening (http:\S+)/.exec(output);
      if (match) resolve(match[1]!);
    });
    server.once('exit', (code) => reject(new Error(`the server exited (${code}) before it listened`)));
  });
  // Warm-up: JIT, pools, the statements' plans.
  for (const variant of VARIANTS) await load(url, variant.path, `warm-${variant.path}`);
  const results = new Map<string, Measurement[]>(VARIANTS.map((variant) => [variant.name, []]));
  for (let round = 0; round < rounds; round++) {
    const order = VARIANTS.map((_, i) => VARIANTS[(i + round) % VARIANTS.length]!);
    for (const variant of order) {
      const measured = await load(url, variant.path, `r${round}-${variant.path}`);
      results.get(variant.name)!.push(measured);
      console.error(`round ${round + 1}: ${variant.name}: ${measured.requestsPerSecond.toFixed(0)} req/s, p99 ${measured.p99Ms.toFixed(1)} ms${measured.errors ? `, ${measured.errors} errors` : ''}`);
    }
  }
  const baseline = results.get(VARIANTS[0].name)!;
  const baseRps = spread(baseline.map((m) => m.requestsPerSecond)).median;
  const baseP99 = spread(baseline.map((m) => m.p99Ms)).median;
  console.log(`\n${seconds} s per variant, ${rounds} rounds, ${connections} connections; median (min–max) over the rounds\n`);
  console.log('| Endpoint | req/s | p99 ms | req/s vs without | p99 vs without | non-201 |');
  console.log('| --- | --- | --- | --- | --- | --- |');
  for (const variant of VARIANTS) {
    const measured = results.get(variant.name)!;
    const rps: Spread = spread(measured.map((m) => m.requestsPerSecond));
    const p99: Spread = spread(measured.map((m) => m.p99Ms));
    const errors = measured.reduce((sum, m) => sum + m.errors, 0);
    console.log(`| ${variant.name} | ${formatSpread(rps)} | ${formatSpread(p99, 1)} | ${(rps.median / baseRps).toFixed(2)}x | ${(p99.median / baseP99).toFixed(2)}x | ${errors} |`);
  }
} finally {
  server.kill('SIGTERM');
  await once(server, 'exit');
  await sql`drop schema ${sql.id(schema)} cascade`.execute(db);
  await db.destroy();
}
