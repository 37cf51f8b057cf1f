/**
 * Every runnable process reports a start it cannot make the way `npx idempotent-jobs worker`
 * does: the lines naming each variable and what is wrong, exit code 2, no stack trace.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { describe, expect, it } from 'vitest';

interface Ended {
  readonly code: number | null;
  readonly stderr: string;
}

async function runRunnable(script: string, env: Record<string, string>): Promise<Ended> {
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  return { code, stderr };
}

const cases: Array<{ runnable: string; script: string; env: Record<string, string>; names: RegExp }> = [
  { runnable: 'the payments worker (npm run worker:payments)', script: 'workers/payments-worker.ts', env: { LEASE_MS: 'abc' }, names: /LEASE_MS: .*"abc"/ },
  { runnable: 'the HTTP server (npm run http), a bad port', script: 'producers/http-server.ts', env: { HTTP_PORT: 'abc' }, names: /HTTP_PORT: .*"abc"/ },
  {
    runnable: 'the HTTP server, a public address without tokens',
    script: 'producers/http-server.ts',
    env: { HTTP_HOST: '0.0.0.0', HTTP_TOKENS: '' },
    names: /Refusing to listen on "0\.0\.0\.0" without authentication.*HTTP_TOKENS/,
  },
  { runnable: 'the outbox relay (npm run relay)', script: 'producers/outbox-relay.ts', env: { CONCURRENCY: '-1' }, names: /CONCURRENCY/ },
  { runnable: 'the maintenance process', script: 'workers/janitor.ts', env: { LEASE_MS: '0' }, names: /LEASE_MS/ },
];

describe('a runnable that cannot start because of its configuration', () => {
  it.concurrent.each(cases)('$runnable: names the variable, exits 2, prints no stack trace', async ({ script, env, names }) => {
    const ended = await runRunnable(script, env);
    expect(ended.stderr).toMatch(names);
    expect(ended.stderr).not.toMatch(/^\s+at /m);
    expect(ended.stderr).not.toContain('throw new');
    expect(ended.code).toBe(2);
  }, 60_000);
});
