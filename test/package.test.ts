// @module-tag redis
/**
 * The package as a user gets it: `npm pack` from a tree without a build (the repository's
 * files, no dist/) builds itself, ships the library, the command and what the command runs,
 * and nothing of the repository's own (demo, load generator, tests, sources). Installed (the
 * tarball unpacked into a project's node_modules, its dependencies from this checkout's, so
 * nothing is downloaded): CommonJS `require` works on every supported Node, and the command
 * prints its version, explains a handler it cannot load, and serves the HTTP API. The README's
 * TypeScript blocks, each a complete program, compile against the shipped types as a user's
 * project would (strict, no skipLibCheck), as an ES module and as CommonJS (TypeScript's
 * "module": "commonjs", as NestJS compiles), and run to their end, twice. `.ci/package-smoke.sh`
 * does the same with `npm install`, and adds a NestJS-style provider.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresDb as createPostgresDbFor } from '../src/store/create-postgres-db.js';
import { systemToolForTests } from './support/system-tools.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TSC = join(ROOT, 'node_modules/typescript/bin/tsc');
const NODES: Array<readonly [string, string | undefined]> = [
  [`this Node (${process.version})`, process.execPath],
  ['Node 22', systemToolForTests('node22')],
  ['Node 24', systemToolForTests('node24')],
];
const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

let env: TestEnv;
let work: string;
let files: string[];
/** The consumer project: the package unpacked into its node_modules. */
let app: string;
let bin: string;

beforeAll(async () => {
  env = await createTestEnv('package');
  work = mkdtempSync(join(tmpdir(), 'ij-package-'));
  // The repository's files as a fresh clone has them (with this checkout's changes), no dist/.
  const tree = join(work, 'tree');
  const tracked = execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' }).split('\0');
  for (const file of tracked.filter((name) => name !== '' && existsSync(join(ROOT, name)))) {
    mkdirSync(dirname(join(tree, file)), { recursive: true });
    cpSync(join(ROOT, file), join(tree, file));
  }
  expect(existsSync(join(tree, 'dist'))).toBe(false);
  // Dependencies for the build and for the installed package: this checkout's (one level up
  // from both the tree and the consumer project).
  symlinkSync(join(ROOT, 'node_modules'), join(tree, 'node_modules'), 'dir');
  symlinkSync(join(ROOT, 'node_modules'), join(work, 'node_modules'), 'dir');
  execFileSync('npm', ['pack', '--silent', '--pack-destination', work], { cwd: tree, stdio: 'ignore', env: { ...process.env, npm_config_loglevel: 'error' } });
  const tarball = join(work, `idempotent-jobs-${VERSION}.tgz`);
  files = execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' }).trim().split('\n').map((name) => name.replace(/^package\//, ''));

  app = join(work, 'app');
  const installed = join(app, 'node_modules/idempotent-jobs');
  mkdirSync(installed, { recursive: true });
  execFileSync('tar', ['-xzf', tarball, '-C', installed, '--strip-components=1']);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'commonjs' }));
  cpSync(join(ROOT, '.ci/package-smoke/worker.cjs'), join(app, 'worker.cjs'));
  bin = join(installed, 'bin/idempotent-jobs.js');
}, 300_000);

afterAll(async () => {
  if (work) rmSync(work, { recursive: true, force: true });
  await env?.teardown();
});

function consumerEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { ...process.env, DATABASE_URL: env.databaseUrl, REDIS_URL: env.redisUrl, SCHEMA: env.schema, REDIS_PREFIX: env.redisPrefix, LOG_LEVEL: 'warn', ...extra };
}

/**
 * Runs a command to its end. The bound is generous (a strict `tsc` without skipLibCheck takes
 * tens of seconds on a busy machine); a command stopped at it says so in its stderr.
 */
function run(command: string, args: string[], options: { cwd?: string; env?: NodeJS.ProcessEnv } = {}) {
  const result = spawnSync(command, args, { cwd: options.cwd ?? app, env: options.env ?? consumerEnv(), encoding: 'utf8', timeout: 240_000 });
  const stopped = result.signal ? `\n(${command} ${args.join(' ')} was stopped by ${result.signal})` : '';
  return { code: result.status, stdout: result.stdout, stderr: result.stderr + stopped };
}

describe('npm pack from a tree without a build', () => {
  it('builds the package and ships the library and the command; nothing of the repository', () => {
    for (const shipped of ['package.json', 'README.md', 'LICENSE', 'CHANGELOG.md', 'bin/idempotent-jobs.js', 'dist/src/index.js', 'dist/src/index.d.ts', 'dist/src/cli/main.js', 'dist/src/amqp/index.js', 'dist/src/nats/index.js', 'dist/src/otel/index.js', 'dist/src/process/index.js', 'dist/src/store/index.js', 'dist/src/pg/index.js', 'dist/src/postgres-js/index.js', 'dist/src/drizzle/index.js', 'dist/src/prisma/index.js', 'dist/src/typeorm/index.js', 'dist/src/knex/index.js', 'dist/src/mikro-orm/index.js', 'dist/src/nestjs/index.js', 'dist/src/bull-board/index.js', 'dist/src/http-idempotency/index.js']) {
      expect(files, shipped).toContain(shipped);
    }
    // The guides ship too, so that the README's and the errors' links resolve in node_modules.
    expect(files).toEqual(expect.arrayContaining(['docs/guide.md', 'docs/configuration.md', 'docs/images/key-inspector.png']));
    const unexpected = files.filter(
      (file) => !/^(dist\/src\/.*\.(js|d\.ts)|bin\/idempotent-jobs\.js|README\.md|LICENSE|CHANGELOG\.md|package\.json|docs\/[a-z-]+\.md|docs\/images\/[a-z-]+\.png)$/.test(file),
    );
    expect(unexpected).toEqual([]);
    expect(files.some((file) => /demo|load-generator|payments-worker|\.test\./.test(file))).toBe(false);
  });
});

describe('the installed package', () => {
  it.each(NODES)('CommonJS: require() of every entry point works on %s', (_name, node) => {
    if (node === undefined) return; // said by the run's set-up (support/system-tools.ts); fails under CI
    const script = `
      const main = require('idempotent-jobs');
      const otel = require('idempotent-jobs/otel');
      const amqp = require('idempotent-jobs/amqp');
      const nats = require('idempotent-jobs/nats');
      const layers = ['pg', 'postgres-js', 'drizzle', 'prisma', 'typeorm', 'knex', 'mikro-orm'].map((name) => require('idempotent-jobs/' + name));
      const nestjs = require('idempotent-jobs/nestjs');
      const board = require('idempotent-jobs/bull-board');
      const requests = require('idempotent-jobs/http-idempotency');
      console.log(JSON.stringify([typeof main.createIdempotentWorker, typeof main.IdempotencyKeys, typeof otel.startTracingFromEnv, typeof amqp.createAmqpConsumer, typeof nats.createIdempotentNatsConsumer,
        typeof layers[0].pgDataLayer, typeof layers[1].postgresJsDataLayer, typeof layers[2].drizzleDataLayer, typeof layers[3].prismaDataLayer, typeof layers[4].typeormDataLayer, typeof layers[5].knexDataLayer, typeof layers[6].mikroOrmDataLayer,
        typeof nestjs.IdempotentJobsModule.forRootAsync, typeof nestjs.IdempotentWorkerHost, typeof board.IdempotentJobsAdapter,
        typeof requests.IdempotentRequests, typeof requests.expressIdempotency, typeof requests.fastifyIdempotency, typeof requests.IdempotencyInterceptor]));`;
    const result = run(node, ['-e', script]);
    expect(result.stderr).toBe('');
    expect(JSON.parse(result.stdout)).toEqual(Array(19).fill('function'));
  });

  it('CommonJS: a plain require() consumer processes a job once', () => {
    const result = run(process.execPath, ['worker.cjs']);
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toMatch(/^completed .*"kind":"completed".*"key":"order-cjs"/m);
  });

  it('the command prints its version', () => {
    for (const flag of ['--version', '-V']) expect(run(process.execPath, [bin, flag]).stdout.trim()).toBe(VERSION);
  });

  it('a handler module that does not exist, or is TypeScript, gets a message saying what to do (exit 2), not a stack from inside the package', () => {
    writeFileSync(join(app, 'handler.ts'), 'export default async (ctx: { data: unknown }) => ctx.data;\n');
    const missing = run(process.execPath, [bin, 'worker', '--queue', 'q', '--handler', './no-such-handler.js']);
    expect(missing.code).toBe(2);
    expect(missing.stderr.trim()).toBe(`--handler ./no-such-handler.js: no such file (${join(app, 'no-such-handler.js')}); give the handler module's path, absolute or relative to ${app}.`);
    expect(missing.stderr).not.toMatch(/^\s+at |dist\//m);
    // Node 22.18 and later strip types by themselves and load such a handler; Node 20 cannot.
    if ((process.features as { typescript?: unknown }).typescript) return;
    const typescript = run(process.execPath, [bin, 'worker', '--queue', 'q', '--handler', './handler.ts']);
    expect(typescript.code).toBe(2);
    expect(typescript.stderr).toMatch(/^--handler \.\/handler\.ts: a TypeScript module, which Node v\S+ does not load by itself\. Compile it to JavaScript \(tsc\) and pass the \.js file, or run the command through a TypeScript loader: npm install tsx, then node --import tsx node_modules\/idempotent-jobs\/bin\/idempotent-jobs\.js <command> --handler \.\/handler\.ts\.\n$/);
    expect(typescript.stderr).not.toMatch(/^\s+at |dist\//m);
  });

  it('`idempotent-jobs http` serves the HTTP API and the key inspector, and stops on SIGTERM', async () => {
    const child = spawn(process.execPath, [bin, 'http'], {
      cwd: app,
      env: consumerEnv({ LOG_LEVEL: 'info', HTTP_PORT: '0', HTTP_QUEUES: 'payments', HTTP_TOKENS: 'tok_acme_0123456789abcdef=acme', ADMIN_TOKENS: 'adm_alice_0123456789abcdef=alice' }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const url = await new Promise<string>((resolve, reject) => {
      void exited.then((code) => reject(new Error(`exited (${code}) before listening: ${stderr}`)));
      createInterface({ input: child.stdout! }).on('line', (line) => {
        const entry = JSON.parse(line) as { msg?: string; url?: string };
        if (entry.msg === 'HTTP API listening') resolve(entry.url!);
      });
    });
    try {
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      const post = await fetch(`${url}/v1/queues/payments/jobs?name=charge`, {
        method: 'POST',
        headers: { authorization: 'Bearer tok_acme_0123456789abcdef', 'idempotency-key': 'from-the-package', 'content-type': 'application/json' },
        body: JSON.stringify({ cents: 1 }),
      });
      // A worker runs beside the API: 202, or 200 when the job finished before the answer read its state.
      expect([200, 202]).toContain(post.status);
      expect(post.headers.get('idempotent-replayed')).toBeNull();
      expect((await fetch(`${url}/ui/`)).status).toBe(200);
      const overview = await fetch(`${url}/ui/view/overview`, { headers: { authorization: 'Bearer adm_alice_0123456789abcdef' } });
      expect(overview.status).toBe(200);
      expect(await overview.text()).toContain('<section class="view" data-view="overview">');
    } finally {
      child.kill('SIGTERM');
    }
    expect(await exited).toBe(0);
  });
});

/** The README's ```ts blocks. */
function readmeTypeScriptBlocks(): string[] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  return [...readme.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]!);
}

const PROJECTS = {
  'an ES module project ("type": "module", TypeScript\'s "module": "nodenext")': {
    type: 'module',
    compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022' },
  },
  'a CommonJS project ("type": "commonjs", TypeScript\'s "module": "commonjs", as NestJS compiles)': {
    type: 'commonjs',
    compilerOptions: { module: 'commonjs', target: 'es2021', allowSyntheticDefaultImports: true },
  },
} as const;

describe("the README's example, as a user runs it", () => {
  it('has TypeScript blocks to run', () => {
    expect(readmeTypeScriptBlocks().length).toBeGreaterThan(0);
  });

  it.each(Object.entries(PROJECTS))('compiles under strict without skipLibCheck and runs to its end, twice, in %s', async (_name, project) => {
    const blocks = readmeTypeScriptBlocks();
    // A database and a Redis database of the example's own: it uses the default schema, a
    // `ledger` table and the default BullMQ prefix, as a user's first program does.
    const database = `ij_readme_${Math.random().toString(16).slice(2, 10)}`;
    await sql`create database ${sql.id(database)}`.execute(env.db);
    const redisDb = await unusedRedisDatabase();
    const url = new URL(env.databaseDirectUrl);
    url.pathname = `/${database}`;
    const exampleEnv = consumerEnv({ DATABASE_URL: url.toString(), REDIS_URL: `${env.redisUrl.replace(/\/\d*$/, '')}/${redisDb}` });
    try {
      for (const [index, code] of blocks.entries()) {
        const dir = join(app, `readme-${project.type}-${index}`);
        mkdirSync(dir, { recursive: true });
        writeFileSync(join(dir, 'package.json'), JSON.stringify({ private: true, type: project.type }));
        writeFileSync(join(dir, 'example.ts'), code);
        writeFileSync(
          join(dir, 'tsconfig.json'),
          JSON.stringify({ compilerOptions: { strict: true, skipLibCheck: false, types: ['node'], outDir: 'dist', ...project.compilerOptions }, files: ['example.ts'] }),
        );
        const compiled = run(process.execPath, [TSC, '-p', dir]);
        expect({ code: compiled.code, output: compiled.stdout + compiled.stderr }, `README block ${index + 1}`).toEqual({ code: 0, output: '' });
        const first = run(process.execPath, [join(dir, 'dist/example.js')], { env: exampleEnv });
        expect(first.code, first.stderr).toBe(0);
        const second = run(process.execPath, [join(dir, 'dist/example.js')], { env: exampleEnv });
        expect(second.code, second.stderr).toBe(0);
        if (index === 0) {
          expect(first.stdout.split('\n').filter((line) => !line.startsWith('{'))).toEqual(['completed: acme/order-42', '']);
          expect(second.stdout).toMatch(/^(duplicate|replayed): acme\/order-42$/m);
        }
      }
      const ledger = createPostgresDbFor({ connectionString: url.toString(), maxConnections: 1 });
      try {
        expect((await sql<{ order_id: number; cents: number }>`select order_id, cents from ledger`.execute(ledger)).rows).toEqual([{ order_id: 42, cents: 1999 }]);
      } finally {
        await ledger.destroy();
      }
    } finally {
      await sql`drop database if exists ${sql.id(database)} with (force)`.execute(env.db);
      await deleteKeys(redisDb, 'bull:payments:*');
    }
  }, 900_000);
});

const claimedRedisDatabases = new Set<number>();

/** A Redis logical database (1–15) holding no key of the example's queue, and not used by this file already. */
async function unusedRedisDatabase(): Promise<number> {
  for (let db = 15; db >= 1; db--) {
    if (claimedRedisDatabases.has(db)) continue;
    const redis = new Redis(env.redisUrl, { db, lazyConnect: true });
    try {
      await redis.connect();
      const [, found] = await redis.scan('0', 'MATCH', 'bull:payments:*', 'COUNT', 1000);
      if (found.length === 0 && (await redis.exists('bull:payments:meta')) === 0) {
        claimedRedisDatabases.add(db);
        return db;
      }
    } finally {
      redis.disconnect();
    }
  }
  throw new Error('no Redis database without keys of a "payments" queue under the prefix "bull"');
}

/** Deletes the keys matching `pattern` in Redis database `db`: the example's, which held none before. */
async function deleteKeys(db: number, pattern: string): Promise<void> {
  const redis = new Redis(env.redisUrl, { db });
  try {
    for (let cursor = '0'; ; ) {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      if (keys.length > 0) await redis.del(...keys);
      if ((cursor = next) === '0') break;
    }
  } finally {
    redis.disconnect();
  }
}
