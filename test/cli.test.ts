/**
 * The `idempotent-jobs` command as scripts use it: a real child process (bin/idempotent-jobs.js,
 * which runs the TypeScript through tsx in a checkout) against this file's schema.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { IdempotencyKeys, JobSteps } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const BIN = fileURLToPath(new URL('../bin/idempotent-jobs.js', import.meta.url));

// Each call is a process that compiles the sources through tsx: seconds on a quiet machine, up
// to half a minute on a loaded one (a suite beside a chaos run). A test makes up to ten calls
// (some in loops), so its time is the sum of theirs, not one call's.
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 10 * CLI_TIMEOUT_MS });

let env: TestEnv;
let keys: IdempotencyKeys;

interface CliResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

function cli(args: string[], extraEnv: Record<string, string> = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [BIN, ...args],
      { env: { ...process.env, DATABASE_URL: env.databaseUrl, SCHEMA: env.schema, LOG_LEVEL: 'silent', ...extraEnv }, timeout: CLI_TIMEOUT_MS },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

const json = (result: CliResult) => JSON.parse(result.stdout) as any;
const table = () => sql.id(env.schema, 'idempotency_keys');

beforeAll(async () => {
  env = await createTestEnv('cli');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: 3_600_000 });
  // completed: acme/paid; failed: acme/declined; processing (lease live): acme/running;
  // processing (lease ended): other/stuck; completed and expired: other/old.
  const fp = keys.fingerprint({ n: 1 });
  for (const [scope, key] of [['acme', 'paid'], ['acme', 'declined'], ['acme', 'running'], ['other', 'stuck'], ['other', 'old']] as const) {
    const claim = await keys.claim(scope, key, fp, { jobId: `job-${key}`, queue: 'payments', jobName: 'charge' });
    if (claim.kind !== 'claimed') throw new Error(`setup: ${claim.kind}`);
    if (key === 'paid' || key === 'old') await keys.runEffect(claim, async () => ({ receipt: `r-${key}` }));
    if (key === 'declined') await keys.fail(claim, new Error('card declined'));
  }
  await sql`update ${table()} set locked_until = now() - interval '1 hour' where key = 'stuck'`.execute(env.db);
  // A live lease for the whole file, however slowly the child processes start.
  await sql`update ${table()} set locked_until = now() + interval '1 hour' where key = 'running'`.execute(env.db);
  await sql`update ${table()} set completed_at = now() - interval '3 days', expires_at = now() - interval '2 days'
             where key = 'old'`.execute(env.db);
});
afterAll(async () => {
  await env?.teardown();
});

describe('idempotent-jobs CLI', () => {
  it('migrate: reports the schema up to date (exit 0), as text and JSON', async () => {
    const text = await cli(['migrate']);
    expect(text).toMatchObject({ code: 0 });
    expect(text.stdout).toContain(`Schema ${env.schema} is up to date.`);
    const asJson = await cli(['migrate', '--json']);
    expect(asJson.code).toBe(0);
    expect(json(asJson)).toEqual({ schema: env.schema, applied: [] });
  });

  it('migrate: connects to DATABASE_DIRECT_URL when set (the migrations\' advisory lock needs a session), not DATABASE_URL', async () => {
    const direct = await cli(['migrate', '--json'], { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/postgres', DATABASE_DIRECT_URL: env.databaseDirectUrl });
    expect(direct.code).toBe(0);
    expect(json(direct)).toEqual({ schema: env.schema, applied: [] });
  });

  it('keys get: shows a key (exit 0), as a table and as JSON; a missing key exits 3', async () => {
    const text = await cli(['keys', 'get', 'acme', 'paid']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^status\s+completed$/m);
    expect(text.stdout).toMatch(/^result\s+\{"receipt":"r-paid"\}$/m);
    expect(text.stdout).toMatch(/^job id\s+job-paid$/m);

    const asJson = await cli(['keys', 'get', 'acme', 'declined', '--json']);
    expect(asJson.code).toBe(0);
    expect(json(asJson)).toMatchObject({
      scope: 'acme',
      key: 'declined',
      status: 'failed',
      fence: 1,
      attempts: 1,
      jobId: 'job-declined',
      queue: 'payments',
      error: { message: 'card declined' },
    });
    expect(Date.parse(json(asJson).createdAt)).not.toBeNaN();

    const missing = await cli(['keys', 'get', 'acme', 'nope', '--json']);
    expect(missing.code).toBe(3);
    expect(json(missing)).toEqual({ found: false, scope: 'acme', key: 'nope' });
    expect(missing.stderr).toContain('No key "nope" in scope "acme"');
    const missingText = await cli(['keys', 'get', 'acme', 'nope']);
    expect(missingText).toMatchObject({ code: 3, stdout: '' });
  });

  it('keys get: a key deleted after its retention with a live tombstone shows the tombstone (exit 0), as a table and as JSON; stats counts it', async () => {
    await sql`insert into ${sql.id(env.schema, 'key_tombstones')} (scope, key_hash, fingerprint_hash, failed, finished_at, expires_at)
              values ('acme', sha256(convert_to('gone', 'UTF8')), sha256(convert_to('fp', 'UTF8')), false, now() - interval '2 days', now() + interval '5 days')`.execute(env.db);
    const text = await cli(['keys', 'get', 'acme', 'gone']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^status\s+tombstone \(completed; result expired, duplicates are not run\)$/m);
    expect(text.stdout).toMatch(/^refused until\s+\d{4}-/m);
    const asJson = await cli(['keys', 'get', 'acme', 'gone', '--json']);
    expect(json(asJson)).toMatchObject({ scope: 'acme', key: 'gone', status: 'tombstone', outcome: 'completed' });
    expect(Date.parse(json(asJson).expiresAt)).toBeGreaterThan(Date.now());
    const stats = await cli(['stats', '--json']);
    expect(json(stats).tombstones).toBe(1);
    expect((await cli(['stats'])).stdout).toMatch(/^Tombstones:\s+1 /m);
  });

  it('keys get: shows each step of a multi-step key (position, name, starts, fence, times, result size), as a table and as JSON', async () => {
    // reserve (database) and charge (external) recorded; e-mail started and not recorded, as
    // when its worker died inside it.
    const claim = await keys.claim('steps', 'order-1', keys.fingerprint({ order: 1 }));
    if (claim.kind !== 'claimed') throw new Error(`setup: ${claim.kind}`);
    const steps = new JobSteps(keys, claim, new AbortController().signal);
    await steps.run('reserve', { transaction: async () => ({ items: 2 }) });
    await steps.run('charge', async () => ({ chargeId: 'ch_ü1' }));
    await keys.startStep(claim, { name: 'email', position: 3 });

    const text = await cli(['keys', 'get', 'steps', 'order-1']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^steps\s+3 \(2 recorded, 1 started and not recorded\)$/m);
    const stepLines = text.stdout.split('\n\n')[1]!.trim().split('\n');
    expect(stepLines[0]).toMatch(/^POSITION\s+STEP\s+STARTS\s+FENCE\s+STARTED\s+RECORDED\s+RESULT BYTES$/);
    const cells = stepLines.slice(1).map((line) => line.split(/\s+/));
    // '{"items":2}' is 11 bytes; '{"chargeId":"ch_ü1"}' 21 (ü is two bytes in UTF-8).
    expect(cells.map(([position, name, starts, fence, , recorded, bytes]) => [position, name, starts, fence, recorded === '-' ? '-' : 'at', bytes])).toEqual([
      ['1', 'reserve', '1', '1', 'at', '11'],
      ['2', 'charge', '1', '1', 'at', '21'],
      ['3', 'email', '1', '1', '-', '-'],
    ]);
    expect(cells.every((row) => !Number.isNaN(Date.parse(row[4]!)))).toBe(true);

    const asJson = await cli(['keys', 'get', 'steps', 'order-1', '--json']);
    expect(asJson.code).toBe(0);
    const { steps: listed } = json(asJson);
    expect(listed).toMatchObject([
      { name: 'reserve', position: 1, starts: 1, fence: 1, resultBytes: 11 },
      { name: 'charge', position: 2, starts: 1, fence: 1, resultBytes: 21 },
      { name: 'email', position: 3, starts: 1, fence: 1, recordedAt: null, resultBytes: null },
    ]);
    expect(Object.keys(listed[0]).sort()).toEqual(['fence', 'name', 'position', 'recordedAt', 'resultBytes', 'startedAt', 'starts']);
    expect(Date.parse(listed[0].recordedAt)).toBeGreaterThanOrEqual(Date.parse(listed[0].startedAt));

    // A key without steps.
    const plain = await cli(['keys', 'get', 'acme', 'paid', '--json']);
    expect(json(plain).steps).toEqual([]);
    expect((await cli(['keys', 'get', 'acme', 'paid'])).stdout).toMatch(/^steps\s+-$/m);

    // Out of the way of the listing tests (its steps go with it).
    await sql`delete from ${table()} where scope = 'steps'`.execute(env.db);
  });

  it('keys list: filters by status, scope and expiry, limits, and prints a table or JSON', async () => {
    const all = await cli(['keys', 'list', '--json']);
    expect(all.code).toBe(0);
    expect(json(all).map((k: any) => `${k.scope}/${k.key}`).sort()).toEqual(
      ['acme/declined', 'acme/paid', 'acme/running', 'other/old', 'other/stuck'],
    );

    const processing = await cli(['keys', 'list', '--status', 'processing', '--json']);
    expect(json(processing).map((k: any) => k.key).sort()).toEqual(['running', 'stuck']);
    const inOther = await cli(['keys', 'list', '--scope', 'other', '--json']);
    expect(json(inOther).map((k: any) => k.key).sort()).toEqual(['old', 'stuck']);
    const expired = await cli(['keys', 'list', '--expired', '--json']);
    expect(json(expired).map((k: any) => k.key).sort()).toEqual(['old', 'stuck']);
    const combined = await cli(['keys', 'list', '--expired', '--status', 'completed', '--json']);
    expect(json(combined).map((k: any) => k.key)).toEqual(['old']);
    const limited = await cli(['keys', 'list', '--limit', '2', '--json']);
    expect(json(limited)).toHaveLength(2);

    const text = await cli(['keys', 'list', '--scope', 'acme']);
    expect(text.code).toBe(0);
    const lines = text.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^SCOPE\s+KEY\s+STATUS\s+FENCE\s+ATTEMPTS/);
    expect(lines.slice(1).map((l) => l.split(/\s+/).slice(0, 3).join(' ')).sort()).toEqual([
      'acme declined failed',
      'acme paid completed',
      'acme running processing',
    ]);
    const none = await cli(['keys', 'list', '--scope', 'nobody']);
    expect(none).toMatchObject({ code: 0, stdout: 'No keys match.\n' });
  });

  it('exits 2 with a reason on bad usage, and 1 when the database is unreachable', async () => {
    const badStatus = await cli(['keys', 'list', '--status', 'done']);
    expect(badStatus.code).toBe(2);
    expect(badStatus.stderr).toContain('must be one of processing, completed, failed, got "done"');
    const badLimit = await cli(['keys', 'list', '--limit', '0']);
    expect(badLimit.code).toBe(2);
    const badDuration = await cli(['keys', 'purge', '--older-than', '7 days']);
    expect(badDuration.code).toBe(2);
    expect(badDuration.stderr).toContain('is not a duration');
    const noReason = await cli(['keys', 'release', 'acme', 'declined']);
    expect(noReason.code).toBe(2);
    expect(noReason.stderr).toContain("required option '--reason <text>'");
    const unknown = await cli(['keys', 'frobnicate']);
    expect(unknown.code).toBe(2);
    const badEnv = await cli(['stats'], { SCHEMA: 'Not-A-Schema' });
    expect(badEnv.code).toBe(2);
    expect(badEnv.stderr).toContain('SCHEMA');
    const tooLong = await cli(['keys', 'get', 'acme', 'k'.repeat(256)]);
    expect(tooLong.code).toBe(2);
    const down = await cli(['stats'], { DATABASE_URL: 'postgres://postgres@127.0.0.1:1/postgres' });
    expect(down.code).toBe(1);
    expect(down.stderr).not.toBe('');
  });

  it('stats, keys, migrate: a server that does not answer, a schema never migrated, or a missing database name the variable and the fix', async () => {
    for (const args of [['stats'], ['keys', 'list']]) {
      const down = await cli(args, { DATABASE_URL: 'postgres://postgres:secret@127.0.0.1:1/postgres' });
      expect(down.code, args.join(' ')).toBe(1);
      expect(down.stderr.trim()).toMatch(
        /^Postgres at DATABASE_URL \(postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:1\/postgres\) did not answer: connect ECONNREFUSED 127\.0\.0\.1:1\. Check that the server is up and DATABASE_URL is right\.$/,
      );
      const unmigrated = await cli(args, { SCHEMA: 'nope_schema' });
      expect(unmigrated.code, args.join(' ')).toBe(2);
      expect(unmigrated.stderr.trim()).toMatch(
        /^Schema "nope_schema" in DATABASE_URL \(.*\) has no idempotency tables \(relation "nope_schema\.\w+" does not exist\)\. Create them with `idempotent-jobs migrate` \(same DATABASE_URL and SCHEMA\)/,
      );
    }
    const url = new URL(env.databaseDirectUrl);
    url.pathname = '/ij_cli_no_such_database';
    // The message shows the URL with its password masked (the embedded test server has one).
    const shown = new URL(url);
    if (shown.password) shown.password = '***';
    for (const args of [['stats'], ['keys', 'get', 'acme', 'paid'], ['migrate']]) {
      const missing = await cli(args, { DATABASE_URL: url.toString(), DATABASE_DIRECT_URL: '' });
      expect(missing.code, args.join(' ')).toBe(2);
      expect(missing.stderr.trim()).toBe(
        `Postgres has no database "ij_cli_no_such_database", which DATABASE_URL (${shown}) names. ` +
          `Create it (createdb -h ${url.hostname} -p ${url.port} -U ${url.username} ij_cli_no_such_database), or point DATABASE_URL at a database that exists.`,
      );
    }
    for (const result of [await cli(['stats'], { SCHEMA: 'nope_schema' })]) expect(result.stderr).not.toMatch(/^\s+at /m);
  }, 240_000); // eight starts of the command, each a few seconds on a busy machine

  it('--version prints the package\'s version', async () => {
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
    for (const flag of ['--version', '-V']) {
      const result = await cli([flag]);
      expect(result.code).toBe(0);
      expect(result.stdout).toBe(`${version}\n`);
    }
  });

  it('stats: counts by status, expired leases, keys past the sweep horizon, expired keys, the oldest processing key (text and JSON)', async () => {
    const asJson = await cli(['stats', '--json']);
    expect(asJson.code).toBe(0);
    expect(json(asJson)).toMatchObject({
      schema: env.schema,
      processing: 2,
      completed: 2,
      failed: 1,
      expiredLeases: 1,
      // other/stuck's lease ended an hour ago: past the default 15-minute sweep horizon.
      pastSweepHorizon: 1,
      expiredKeys: 1,
      oldestProcessing: { scope: 'acme', key: 'running' },
      outboxUnsent: 0,
      oldestUnsentAgeMs: null,
    });
    const text = await cli(['stats']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^processing\s+2$/m);
    expect(text.stdout).toMatch(/^completed\s+2$/m);
    expect(text.stdout).toMatch(/^failed\s+1$/m);
    expect(text.stdout).toMatch(/^Expired leases:\s+1 /m);
    expect(text.stdout).toMatch(/^Past sweep horizon:\s+1 /m);
    const longHorizon = await cli(['stats', '--json'], { SWEEP_AFTER_MS: String(2 * 3600_000) });
    expect(json(longHorizon)).toMatchObject({ expiredLeases: 1, pastSweepHorizon: 0 });
    expect(text.stdout).toMatch(/^Oldest processing key: "running" in scope "acme"/m);
  });

  it('keys release: unlocks a failed key and records who and why; completed keys exit 4, missing ones 3', async () => {
    const released = await cli(['keys', 'release', 'acme', 'declined', '--reason', 'card updated by support', '--json']);
    expect(released.code).toBe(0);
    const body = json(released);
    expect(body).toMatchObject({ released: true, previousStatus: 'failed', key: { status: 'processing', owner: null } });
    expect(body.key.error).toMatchObject({
      released_by_operator: true,
      reason: 'card updated by support',
      by: expect.stringMatching(/^cli:./),
      previous_status: 'failed',
      previous_error: { message: 'card declined' },
    });
    // The release is also in the key's audit record, with who, why and what it replaced.
    const { rows: audit } = await sql<{ action: string; actor: string; reason: string; detail: unknown }>`
      select action, actor, reason, detail from ${sql.id(env.schema, 'key_audit')} where scope = 'acme' and key = 'declined'`.execute(env.db);
    expect(audit).toEqual([
      { action: 'release', actor: expect.stringMatching(/^cli:./), reason: 'card updated by support', detail: { previous_status: 'failed', fence: 1 } },
    ]);
    // The key is claimable at once, by takeover (fence 2), with the same payload.
    const claim = await keys.claim('acme', 'declined', keys.fingerprint({ n: 1 }));
    expect(claim).toMatchObject({ kind: 'taken-over', fence: 2 });

    const text = await cli(['keys', 'release', 'other', 'stuck', '--reason', 'worker host lost']);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain('Released key "stuck" in scope "other" (was processing)');
    expect(text.stdout).toContain('Its last job was job-stuck on queue "payments".');

    const completed = await cli(['keys', 'release', 'acme', 'paid', '--reason', 'x', '--json']);
    expect(completed.code).toBe(4);
    expect(json(completed)).toEqual({ released: false, status: 'completed', scope: 'acme', key: 'paid' });
    expect(completed.stderr).toContain('only processing or failed keys can be released');
    expect((await keys.get('acme', 'paid'))!.status).toBe('completed');

    const missing = await cli(['keys', 'release', 'acme', 'nope', '--reason', 'x']);
    expect(missing.code).toBe(3);
    const empty = await cli(['keys', 'release', 'acme', 'paid', '--reason', ' ']);
    expect(empty.code).toBe(2);
  });

  it('keys purge: deletes finished keys older than the duration, never processing ones (text and JSON)', async () => {
    const nothing = await cli(['keys', 'purge', '--older-than', '7d', '--json']);
    expect(nothing.code).toBe(0);
    expect(json(nothing)).toEqual({ deleted: 0, olderThanMs: 7 * 86_400_000 });

    const purged = await cli(['keys', 'purge', '--older-than', '24h', '--json']);
    expect(json(purged)).toEqual({ deleted: 1, olderThanMs: 86_400_000 });
    expect(await keys.get('other', 'old')).toBeUndefined();

    // Make every key look a week old: only the finished one (acme/paid) goes.
    await sql`update ${table()} set created_at = now() - interval '7 days', completed_at = coalesce(completed_at, now()) - interval '7 days'`.execute(env.db);
    const text = await cli(['keys', 'purge', '--older-than', '30m']);
    expect(text).toMatchObject({ code: 0, stdout: 'Purged 1 finished key older than 30m.\n' });
    const { rows } = await sql<{ key: string; status: string }>`select key, status from ${table()} order by key`.execute(env.db);
    expect(rows).toEqual([
      { key: 'declined', status: 'processing' },
      { key: 'running', status: 'processing' },
      { key: 'stuck', status: 'processing' },
    ]);
  });
});
