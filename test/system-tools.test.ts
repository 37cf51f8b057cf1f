// @module-tag redis
/**
 * The README's test command on a machine without the programs some files need (Chromium,
 * PgBouncer, promtool, Python): outside CI those files' tests are skipped and the run says, one
 * line per program, what is missing and the command that installs it; under CI=true the same
 * files fail. The programs are hidden from a nested vitest run by pointing their variables at
 * paths that do not exist (support/system-tools.ts honours them), never by uninstalling them.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileNamed, runNestedVitest, type NestedRun } from './support/nested-vitest.js';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { SYSTEM_TOOLS, type SystemToolName, findSystemTool, missingToolLine } from './support/system-tools.js';

const HIDDEN = {
  CHROMIUM_PATH: '/nonexistent/chromium',
  PGBOUNCER: '/nonexistent/pgbouncer',
  PROMTOOL: '/nonexistent/promtool',
  PYTHON3: '/nonexistent/python3',
};
const FILES = ['test/key-inspector-browser.test.ts', 'test/pgbouncer.test.ts', 'test/dashboard-alerts.test.ts', 'test/foreign-job-ids.test.ts'];
const reports = mkdtempSync(join(tmpdir(), 'ij-system-tools-'));
afterAll(() => rmSync(reports, { recursive: true, force: true }));

/** `npm test -- <files>` as a nested vitest run, with the programs hidden and CI set or not. */
function runTests(ci: boolean): Promise<NestedRun> {
  const env = {
    ...process.env,
    ...HIDDEN,
    CI: ci ? 'true' : '',
    DATABASE_URL: inject('databaseDirectUrl'),
    REDIS_URL: inject('redisUrl'),
    TEST_PGBOUNCER: '',
    NO_COLOR: '1',
  };
  return runNestedVitest(FILES, env, join(reports, `${ci ? 'ci' : 'local'}.json`));
}

describe('a test file whose program is missing', () => {
  it('finds a program by its variable only when the variable is set, and says in one line what is missing and how to install it', () => {
    expect(findSystemTool('chromium', { ...process.env, CHROMIUM_PATH: '/nonexistent/chromium' })).toBeUndefined();
    expect(findSystemTool('curl', { ...process.env, CURL: process.execPath })).toBe(process.execPath);
    const line = missingToolLine('pgbouncer', { PGBOUNCER: '/nonexistent/pgbouncer' });
    expect(line).toBe(
      'test/pgbouncer.test.ts skipped: PgBouncer PGBOUNCER=/nonexistent/pgbouncer is not an executable; ' +
        'install it with `apt-get install pgbouncer`, or set PGBOUNCER to its path.',
    );
    expect(missingToolLine('promtool', { CI: 'true', PATH: '/nonexistent' })).toMatch(/^test\/dashboard-alerts\.test\.ts: the promtool checks fails under CI=true: promtool not found/);
  });

  it('outside CI: its tests are skipped, the run passes, and one line per program says what is missing and the command that installs it', async () => {
    const run = await runTests(false);
    expect(run.code, run.output).toBe(0);
    for (const file of ['test/key-inspector-browser.test.ts', 'test/pgbouncer.test.ts', 'test/foreign-job-ids.test.ts']) {
      const report = fileNamed(run, file);
      expect(report.assertionResults.length, file).toBeGreaterThan(0);
      expect(report.assertionResults.every((test) => test.status === 'skipped' || test.status === 'pending'), file).toBe(true);
    }
    // Only what needs promtool is skipped; the dashboard's other checks run.
    const dashboard = fileNamed(run, 'test/dashboard-alerts.test.ts').assertionResults;
    expect(dashboard.filter((test) => test.status !== 'passed').map((test) => test.title)).toEqual([expect.stringMatching(/^promtool: /)]);

    const hidden = { chromium: 'CHROMIUM_PATH', pgbouncer: 'PGBOUNCER', promtool: 'PROMTOOL', python3: 'PYTHON3' } as const;
    // The programs' lines (a missing Redis or broker has a line of its own, naming its tag).
    const lines = run.output.split('\n').filter((line) => line.startsWith('[tests] ') && line.includes(' skipped: ') && !line.includes('@module-tag'));
    // Besides the hidden four, one line for each program this machine itself lacks (Patroni on a
    // developer's machine, say).
    const missingHere = (Object.keys(SYSTEM_TOOLS) as SystemToolName[]).filter((name) => !(name in hidden) && findSystemTool(name) === undefined);
    expect(lines).toHaveLength(Object.keys(hidden).length + missingHere.length);
    for (const [name, variable] of Object.entries(hidden)) {
      const tool = SYSTEM_TOOLS[name as keyof typeof hidden];
      expect(lines, name).toContainEqual(
        `[tests] ${tool.neededBy} skipped: ${tool.title} ${variable}=${HIDDEN[variable]} is not an executable; install it with \`${tool.install}\`, or set ${variable} to its path.`,
      );
    }
    expect(run.output).not.toMatch(/Failed to launch|^\s+at /m);
  }, 180_000);

  it('under CI=true: each file whose program is missing fails, with the same line', async () => {
    const run = await runTests(true);
    expect(run.code).not.toBe(0);
    for (const [file, tool] of [
      ['test/key-inspector-browser.test.ts', 'Chromium CHROMIUM_PATH=/nonexistent/chromium'],
      ['test/pgbouncer.test.ts', 'PgBouncer PGBOUNCER=/nonexistent/pgbouncer'],
      ['test/dashboard-alerts.test.ts', 'promtool PROMTOOL=/nonexistent/promtool'],
      ['test/foreign-job-ids.test.ts', 'Python 3 PYTHON3=/nonexistent/python3'],
    ] as const) {
      const report = fileNamed(run, file);
      expect(report.status, file).toBe('failed');
      expect(report.message, file).toContain(`fails under CI=true: ${tool} is not an executable; install it with`);
    }
  }, 180_000);
});
