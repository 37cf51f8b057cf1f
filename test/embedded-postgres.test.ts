/**
 * The embedded Postgres of `npm run demo` and `npm test` (demo/embedded-postgres.ts): it starts,
 * answers, and is removed when stopped; and a process that used it exits with its own exit code
 * (a failed demo or test run stays failed), not the 0 that embedded-postgres's exit hook forces.
 */
import { spawn } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, realpathSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { expect, it } from 'vitest';
import { startEmbeddedPostgres } from '../demo/embedded-postgres.js';
import { reachableBy } from '../demo/embedded-runtime.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

it('starts a Postgres that answers, without a password when it trusts local connections, and removes its data when stopped', async () => {
  const server = await startEmbeddedPostgres({ purpose: 'embedded-test', trust: true });
  try {
    const url = new URL(server.url);
    url.password = '';
    const client = new pg.Client({ connectionString: url.toString() });
    await client.connect();
    try {
      const { rows } = await client.query<{ one: number }>('select 1 as one');
      expect(rows).toEqual([{ one: 1 }]);
    } finally {
      await client.end();
    }
  } finally {
    await server.stop();
  }
  expect(existsSync(server.directory)).toBe(false);
}, 120_000);

const BINARIES = `@embedded-postgres/${process.platform}-${process.arch}`;
const AS_ROOT = process.getuid?.() === 0;

it.skipIf(!AS_ROOT)(
  'as root, with the checkout under a directory other users cannot enter (0700: /root, a mktemp -d), runs from a copy the postgres user can reach',
  async () => {
    // A checkout's node_modules inside a 0700 directory: embedded-postgres and its binaries
    // copied there, its JavaScript dependencies linked.
    const home = mkdtempSync(join(tmpdir(), 'ij-0700-'));
    expect(statSync(home).mode & 0o777).toBe(0o700);
    const modules = join(home, 'clone', 'node_modules');
    try {
      mkdirSync(join(modules, '@embedded-postgres'), { recursive: true });
      cpSync(join(ROOT, 'node_modules', 'embedded-postgres'), join(modules, 'embedded-postgres'), { recursive: true, dereference: true });
      cpSync(join(ROOT, 'node_modules', BINARIES), join(modules, BINARIES), { recursive: true, verbatimSymlinks: true });
      for (const name of ['pg', 'async-exit-hook']) symlinkSync(realpathSync(join(ROOT, 'node_modules', name)), join(modules, name), 'dir');
      // What made initdb fail with EACCES: the server's user cannot reach the binaries there.
      expect(reachableBy('postgres', join(modules, BINARIES, 'native', 'bin'))).toBe(false);

      const startedAt = Date.now();
      const server = await startEmbeddedPostgres({ purpose: 'embedded-0700-test', trust: true, modulesDir: modules });
      try {
        const url = new URL(server.url);
        url.password = '';
        const client = new pg.Client({ connectionString: url.toString() });
        await client.connect();
        try {
          expect((await client.query<{ one: number }>('select 1 as one')).rows).toEqual([{ one: 1 }]);
        } finally {
          await client.end();
        }
      } finally {
        await server.stop();
      }
      expect(Date.now() - startedAt).toBeLessThan(90_000);
      expect(existsSync(server.directory)).toBe(false);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  },
  150_000,
);

it.skipIf(!AS_ROOT)(
  "as root, a reachable copy whose checkout is gone (its dependency links dangle) is made again, not used",
  async () => {
    // A private TMPDIR (0755, as /tmp is searchable): the copy lands there, not in the machine's.
    const privateTmp = mkdtempSync(join(tmpdir(), 'ij-copy-tmp-'));
    chmodSync(privateTmp, 0o755);
    const home = mkdtempSync(join(tmpdir(), 'ij-0700-gone-'));
    const modules = join(home, 'clone', 'node_modules');
    const previousTmp = process.env.TMPDIR;
    process.env.TMPDIR = privateTmp;
    try {
      mkdirSync(join(modules, '@embedded-postgres'), { recursive: true });
      cpSync(join(ROOT, 'node_modules', 'embedded-postgres'), join(modules, 'embedded-postgres'), { recursive: true, dereference: true });
      cpSync(join(ROOT, 'node_modules', BINARIES), join(modules, BINARIES), { recursive: true, verbatimSymlinks: true });
      for (const name of ['pg', 'async-exit-hook']) symlinkSync(realpathSync(join(ROOT, 'node_modules', name)), join(modules, name), 'dir');
      // A complete copy left by a checkout since removed: its links lead nowhere.
      const copies = () => readdirSync(privateTmp).filter((name) => name.startsWith('idempotent-jobs-embedded-postgres-') && !name.includes('-pg-'));
      const first = await startEmbeddedPostgres({ purpose: 'embedded-gone-test', trust: true, modulesDir: modules });
      await first.stop();
      const [copy] = copies();
      expect(copy).toBeDefined();
      const link = join(privateTmp, copy!, 'node_modules', 'pg');
      rmSync(link);
      symlinkSync(join(home, 'removed-clone', 'node_modules', 'pg'), link, 'dir');

      const server = await startEmbeddedPostgres({ purpose: 'embedded-gone-test', trust: true, modulesDir: modules });
      await server.stop();
      expect(existsSync(join(link, 'package.json'))).toBe(true);
    } finally {
      if (previousTmp === undefined) delete process.env.TMPDIR;
      else process.env.TMPDIR = previousTmp;
      rmSync(home, { recursive: true, force: true });
      rmSync(privateTmp, { recursive: true, force: true });
    }
  },
  150_000,
);

it('reachableBy: a directory is reachable by a user when every directory on its path lets it search', () => {
  const home = mkdtempSync(join(tmpdir(), 'ij-reach-'));
  try {
    mkdirSync(join(home, 'bin'));
    expect(reachableBy('postgres', tmpdir())).toBe(true);
    expect(reachableBy('postgres', join(home, 'bin'))).toBe(false); // mkdtemp: 0700, root's
    expect(reachableBy('no-such-user-ij', join(home, 'bin'))).toBe(false);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

it.each([
  { what: '3, set', set: 'process.exitCode = 3;', code: 3 },
  { what: '0, unset', set: '', code: 0 },
])('leaves a process that used it the exit code it ends with: $what', async ({ set, code: expected }) => {
  const script =
    "const { startEmbeddedPostgres } = await import('./demo/embedded-postgres.ts');" +
    "const server = await startEmbeddedPostgres({ purpose: 'embedded-exit-test' });" +
    'await server.stop();' +
    set;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  expect(code, output).toBe(expected);
  expect(output).toBe('');
}, 120_000);
