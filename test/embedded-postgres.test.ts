/**
 * The embedded Postgres of `npm run demo` and `npm test` (demo/embedded-postgres.ts): it starts,
 * answers, and is removed when stopped; and a process that used it exits with its own exit code
 * (a failed demo or test run stays failed), not the 0 that embedded-postgres's exit hook forces.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { expect, it } from 'vitest';
import { startEmbeddedPostgres } from '../demo/embedded-postgres.js';

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
