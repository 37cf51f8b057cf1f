// @module-tag redis
import { Writable } from 'node:stream';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, IdempotencyKeys, JobSteps, Schedules, ValidationError, scheduleScope, createHttpApi, type HttpApi } from '../src/index.js';
import { loadHttpEnvConfig, parseAdminTokens } from '../src/process/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const ADMIN = 'adm_alice_0123456789abcdef';
const TENANT = 'tok_acme_0123456789abcdef';
const HOSTILE_KEY = '<script>alert(1)</script>';
const HOSTILE_SCOPE = `"'><svg onload=alert(2)>`;
const HOSTILE_RESULT = { html: '<img src=x onerror=alert(3)>', quote: `"'&` };

let env: TestEnv;
let keys: IdempotencyKeys;
let api: HttpApi;
let queue: Queue;
const logLines: Array<Record<string, unknown>> = [];

const auth = (token: string) => ({ authorization: `Bearer ${token}` });
const table = () => sql.id(env.schema, 'idempotency_keys');
const auditTable = () => sql.id(env.schema, 'key_audit');

/** Claims a key (it must be new) and settles it as asked. */
async function seed(scope: string, key: string, settle: 'complete' | 'fail' | 'hold', result: unknown = { ok: key }, jobId?: string) {
  const claim = await keys.claim(scope, key, keys.fingerprint({ key }), { jobId: jobId ?? `job-${key}`, queue: 'payments', jobName: 'charge' });
  if (claim.kind !== 'claimed') throw new Error(`setup: ${scope}/${key} was ${claim.kind}`);
  if (settle === 'complete') await keys.runEffect(claim, async () => result);
  if (settle === 'fail') await keys.fail(claim, new Error(`declined ${key}`));
  return claim;
}

async function view(path: string, headers: Record<string, string> = auth(ADMIN)) {
  return api.app.inject({ method: 'GET', url: `/ui/view${path}`, headers });
}

async function release(body: unknown, headers: Record<string, string> = auth(ADMIN)) {
  return api.app.inject({ method: 'POST', url: '/ui/view/release', headers: { ...headers, 'content-type': 'application/json' }, payload: JSON.stringify(body) });
}

async function auditOf(scope: string, key: string) {
  const { rows } = await sql<{ action: string; actor: string; reason: string; detail: unknown }>`
    select action, actor, reason, detail from ${auditTable()} where scope = ${scope} and key = ${key} order by id`.execute(env.db);
  return rows;
}

/** The keys a list view shows, in order (link texts are the keys, escaped). */
function listedKeys(body: string): string[] {
  return [...body.matchAll(/<td><a href="#\/key\?[^"]*"><bdi>([^<]*)<\/bdi><\/a><\/td>/g)].map((m) => unescape(m[1]!));
}

/** A paging link's route, as the script would fetch it. */
function pagingLink(body: string, rel: 'next' | 'prev'): string | undefined {
  const match = new RegExp(`<a href="#(/keys\\?[^"]*)" rel="${rel}">`).exec(body);
  return match ? unescape(match[1]!) : undefined;
}

function unescape(text: string): string {
  return text.replace(/&#(\d+);/g, (_, code) => String.fromCharCode(Number(code)));
}

beforeAll(async () => {
  env = await createTestEnv('key-inspector');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: 3_600_000 });
  const logStream = new Writable({
    write(chunk, _encoding, done) {
      for (const line of String(chunk).split('\n')) if (line.trim() !== '') logLines.push(JSON.parse(line));
      done();
    },
  });
  api = await createHttpApi({
    keys,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    queues: ['payments'],
    tokens: { [TENANT]: 'acme' },
    adminTokens: { [ADMIN]: 'alice' },
    relay: false,
    logger: pino({ level: 'info' }, logStream),
  });
  queue = new Queue('payments', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });

  // acme: paid (completed, with steps, its job waiting in BullMQ), declined (failed), stuck
  // (processing, lease ended long ago), running (processing, live lease), moved (taken over).
  const paid = await seed('acme', 'paid', 'hold', undefined, 'job-paid');
  const steps = new JobSteps(keys, paid, new AbortController().signal);
  await steps.run('reserve', { transaction: async () => ({ items: 2 }) });
  await steps.run('charge', async () => ({ chargeId: 'ch_1' }));
  await keys.runEffect(paid, async () => ({ receipt: 'r-paid' }));
  await queue.add('charge', { order: 1 }, { jobId: 'job-paid' });
  await seed('acme', 'declined', 'fail');
  await seed('acme', 'stuck', 'hold');
  await sql`update ${table()} set locked_until = now() - interval '1 hour' where key = 'stuck'`.execute(env.db);
  await seed('acme', 'running', 'hold');
  await sql`update ${table()} set locked_until = now() + interval '1 hour' where key = 'running'`.execute(env.db);
  await seed('acme', 'moved', 'hold');
  await sql`update ${table()} set locked_until = now() - interval '1 second' where key = 'moved'`.execute(env.db);
  const takeover = await keys.claim('acme', 'moved', keys.fingerprint({ key: 'moved' }));
  if (takeover.kind !== 'taken-over') throw new Error(`setup: moved was ${takeover.kind}`);
  await keys.runEffect(takeover, async () => ({ ok: 'moved' }));
  // Hostile input: a key, a scope and a result that are markup.
  await seed('acme', HOSTILE_KEY, 'complete', HOSTILE_RESULT);
  await seed(HOSTILE_SCOPE, 'k', 'fail');
});

afterAll(async () => {
  await queue?.close();
  await api?.close();
  await env?.teardown();
});

describe('key inspector: access', () => {
  it('serves the page itself to anyone (it holds no data), with a CSP that forbids inline script and framing', async () => {
    const redirect = await api.app.inject({ url: '/ui' });
    expect(redirect.statusCode).toBe(302);
    expect(redirect.headers.location).toBe('/ui/');
    const page = await api.app.inject({ url: '/ui/' });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(page.body).toContain('<script type="module" src="inspector.js"></script>');
    expect(page.headers['content-security-policy']).toContain("script-src 'self'");
    expect(page.headers['content-security-policy']).toContain("frame-ancestors 'none'");
    const script = await api.app.inject({ url: '/ui/inspector.js' });
    expect(script.headers['content-type']).toBe('text/javascript; charset=utf-8');
    expect(script.body).toContain('sessionStorage');
    expect(script.body).not.toContain('cookie');
  });

  it('refuses every view and the release without an admin token: none, a tenant token, an unknown token', async () => {
    for (const headers of [{}, auth(TENANT), auth('adm_unknown_0123456789abcdef'), { authorization: `Basic ${Buffer.from(`x:${ADMIN}`).toString('base64')}` }]) {
      for (const path of ['/overview', '/keys?status=processing', '/key?scope=acme&key=paid']) {
        const response = await view(path, headers);
        expect(response.statusCode, path).toBe(401);
        expect(response.headers['www-authenticate']).toMatch(/^Bearer realm="idempotent-jobs"/);
        expect(response.body).toContain('needs an admin token');
        expect(response.body).not.toContain('r-paid');
      }
      const refused = await release({ scope: 'acme', key: 'stuck', reason: 'x' }, headers);
      expect(refused.statusCode).toBe(401);
    }
    expect((await keys.get('acme', 'stuck'))!.owner).not.toBeNull();
    expect(await auditOf('acme', 'stuck')).toEqual([]);
  });

  it('keeps admin tokens apart from tenant tokens, and reads ADMIN_TOKENS', async () => {
    await expect(
      createHttpApi({ keys, connection: { url: env.redisUrl }, queues: ['payments'], tokens: { [TENANT]: 'acme' }, adminTokens: { [TENANT]: 'alice' }, relay: false }),
    ).rejects.toThrow(ValidationError);
    await expect(createHttpApi({ keys, connection: { url: env.redisUrl }, queues: ['payments'], adminTokens: { short: 'alice' }, relay: false })).rejects.toThrow(
      /at least 16 printable ASCII/,
    );
    expect(parseAdminTokens(` ${ADMIN}=alice@ops , adm_bob_0123456789abcdef=bob`)).toEqual(
      new Map([
        [ADMIN, 'alice@ops'],
        ['adm_bob_0123456789abcdef', 'bob'],
      ]),
    );
    expect(() => parseAdminTokens(`${ADMIN}=al ice`)).toThrow(ConfigError);
    expect(() => parseAdminTokens('nobody')).toThrow(/ADMIN_TOKENS: entry 1 is not "token=operator"/);
    const config = loadHttpEnvConfig({ HTTP_TOKENS: `${TENANT}=acme`, ADMIN_TOKENS: `${ADMIN}=alice` });
    expect(config.ADMIN_TOKENS).toEqual(new Map([[ADMIN, 'alice']]));
    expect(() => loadHttpEnvConfig({ HTTP_TOKENS: `${TENANT}=acme`, ADMIN_TOKENS: `${TENANT}=alice` })).toThrow(/ADMIN_TOKENS: entry 1 is also a tenant token/);
  });

  it('without admin tokens: answers on loopback as operator "loopback", refuses beyond loopback and requests for another host name', async () => {
    const open = await createHttpApi({ keys, connection: { url: env.redisUrl }, prefix: env.redisPrefix, queues: ['payments'], relay: false, logger: pino({ level: 'silent' }) });
    const exposed = await createHttpApi({
      keys,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      queues: ['payments'],
      tokens: { [TENANT]: 'acme' },
      relay: false,
      logger: pino({ level: 'silent' }),
    });
    try {
      const openUrl = await open.listen({ host: '127.0.0.1', port: 0 });
      expect((await fetch(`${openUrl}/ui/view/overview`)).status).toBe(200);
      // A page on another site that resolves its own name to 127.0.0.1 (DNS rebinding) names its host.
      const rebound = await open.app.inject({ url: '/ui/view/overview', headers: { host: 'attacker.example:3000' } });
      expect(rebound.statusCode).toBe(403);
      expect(rebound.body).toContain('loopback name');

      const exposedUrl = await exposed.listen({ host: '0.0.0.0', port: 0 });
      const local = exposedUrl.replace('0.0.0.0', '127.0.0.1');
      const refused = await fetch(`${local}/ui/view/overview`);
      expect(refused.status).toBe(403);
      expect(await refused.text()).toContain('no admin tokens are configured');

      await seed('loop', 'stuck', 'hold');
      const released = await fetch(`${openUrl}/ui/view/release`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ scope: 'loop', key: 'stuck', reason: 'host lost' }),
      });
      expect(released.status).toBe(200);
      expect(await auditOf('loop', 'stuck')).toEqual([{ action: 'release', actor: 'loopback', reason: 'host lost', detail: { previous_status: 'processing', fence: 1 } }]);
    } finally {
      await open.close();
      await exposed.close();
    }
  });
});

describe('key inspector: views', () => {
  it('overview: keys by status, expired leases, the oldest processing key, recent failures and takeovers', async () => {
    const response = await view('/overview');
    expect(response.statusCode).toBe(200);
    const body = response.body;
    const count = (name: string) => Number(new RegExp(`data-count="${name}">(\\d+)<`).exec(body)?.[1]);
    const { rows } = await sql<{ status: string; n: string }>`select status, count(*) as n from ${table()} group by status`.execute(env.db);
    const byStatus = Object.fromEntries(rows.map((r) => [r.status, Number(r.n)]));
    expect(count('processing')).toBe(byStatus.processing);
    expect(count('completed')).toBe(byStatus.completed);
    expect(count('failed')).toBe(byStatus.failed);
    expect(count('expired-leases')).toBeGreaterThanOrEqual(1);
    const section = (title: string) => body.slice(body.indexOf(`<h3>${title}</h3>`)).split('<h3>')[1]!;
    expect(listedKeys(section('Expired leases'))).toContain('stuck');
    expect(listedKeys(section('Expired leases'))).not.toContain('running');
    expect(listedKeys(section('Recent failures'))).toEqual(expect.arrayContaining(['declined', 'k']));
    expect(listedKeys(section('Recent takeovers'))).toEqual(['moved']);
    expect(body).toMatch(/Oldest processing key: <a href="#\/key\?scope=[^"]*"><bdi>[^<]+<\/bdi><\/a> in scope <bdi>/);
  });

  it("a key's page: status, fence, attempts, owner and lease, job id, queue and the BullMQ job's state, steps and result", async () => {
    const response = await view(`/key?${new URLSearchParams({ scope: 'acme', key: 'paid' })}`);
    expect(response.statusCode).toBe(200);
    // A field's text: chosen text (job id, queue) comes isolated in a <bdi>.
    const field = (name: string) => unescape(new RegExp(`data-field="${name}">([^]*?)</(dd|pre|p)>`).exec(response.body)?.[1] ?? '').replace(/<\/?bdi>/g, '');
    expect(field('status')).toContain('completed');
    expect(field('fence')).toBe('1');
    expect(field('attempts')).toBe('1');
    expect(field('job-id')).toBe('job-paid');
    expect(field('queue')).toBe('payments');
    expect(field('job-state')).toBe('waiting');
    expect(JSON.parse(field('result'))).toEqual({ receipt: 'r-paid' });
    expect(response.body).toContain('<tr data-step="reserve">');
    expect(response.body).toContain('<tr data-step="charge">');
    expect(unescape(response.body)).toContain('"chargeId": "ch_1"');
    // Completed keys offer no release.
    expect(response.body).not.toContain('data-post="/release"');

    const running = await view(`/key?${new URLSearchParams({ scope: 'acme', key: 'running' })}`);
    expect(running.body).toMatch(/data-field="lease">[^<]*left\)</);
    expect(running.body).toContain('data-post="/release"');
    const stuck = await view(`/key?${new URLSearchParams({ scope: 'acme', key: 'stuck' })}`);
    expect(stuck.body).toMatch(/data-field="lease">[^<]*\(ended [^<]* ago\)</);
    expect(stuck.body).toMatch(/data-field="job-state">unknown/);
  });

  it("a key deleted after its retention shows its tombstone: outcome, when it finished, until when duplicates are refused; the overview counts them", async () => {
    await sql`insert into ${sql.id(env.schema, 'key_tombstones')} (scope, key_hash, fingerprint_hash, failed, finished_at, expires_at)
              values ('acme', sha256(convert_to('buried', 'UTF8')), sha256(convert_to('fp', 'UTF8')), true, now() - interval '2 days', now() + interval '5 days')`.execute(env.db);
    const page = await view('/key?scope=acme&key=buried');
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('data-view="tombstone"');
    expect(page.body).toContain('<span class="status status-tombstone">tombstone (failed)</span>');
    expect(page.body).toMatch(/data-field="refused-until">\d{4}-/);
    expect((await view('/overview')).body).toMatch(/data-count="tombstones">[1-9]/);
  });

  it('a missing key is a 404 view; a bad status, scope or cursor a 400 view', async () => {
    const missing = await view('/key?scope=acme&key=nope');
    expect(missing.statusCode).toBe(404);
    expect(missing.body).toContain('No key <code><bdi>nope</bdi></code> in scope <code><bdi>acme</bdi></code>');
    expect((await view('/keys?status=stuck')).statusCode).toBe(400);
    expect((await view('/key?scope=acme')).statusCode).toBe(400);
    expect((await view(`/key?scope=acme&key=${'x'.repeat(256)}`)).statusCode).toBe(400);
    expect((await view('/keys?afterScope=acme')).statusCode).toBe(400);
    expect((await view('/keys?limit=0')).statusCode).toBe(400);
    expect((await view('/nothing-here')).statusCode).toBe(404);
  });

  it('escapes hostile keys, scopes and results everywhere they are shown', async () => {
    const pages = [
      await view('/overview'),
      await view('/keys'),
      await view(`/key?${new URLSearchParams({ scope: 'acme', key: HOSTILE_KEY })}`),
      await view(`/key?${new URLSearchParams({ scope: HOSTILE_SCOPE, key: 'k' })}`),
      await view(`/key?${new URLSearchParams({ scope: HOSTILE_SCOPE, key: HOSTILE_KEY })}`),
    ];
    for (const page of pages) {
      expect(page.body).not.toContain('<script');
      expect(page.body).not.toContain('<svg');
      expect(page.body).not.toContain('<img');
      expect(page.body).not.toMatch(/"'>/);
    }
    expect(pages[2]!.body).toContain('<code class="key-name"><bdi>&#60;script&#62;alert(1)&#60;/script&#62;</bdi></code>');
    expect(JSON.parse(unescape(/data-field="result">([^]*?)<\/pre>/.exec(pages[2]!.body)![1]!))).toEqual(HOSTILE_RESULT);
    expect(pages[3]!.body).toContain('<code class="scope-name"><bdi>&#34;&#39;&#62;&#60;svg onload=alert(2)&#62;</bdi></code>');
    expect(pages[4]!.statusCode).toBe(404);
  });

  it('isolates keys and scopes from the page\'s text and shows their bidirectional controls instead of applying them', async () => {
    const spoof = 'refund-\u202Efdp.exe'; // shows as "refund-exe.pdf" where the override acts
    const rtlScope = 'acme-\u202E';
    await seed(rtlScope, spoof, 'complete', { note: 'paid \u2067back\u2069' });
    const pages = [
      await view('/overview'),
      await view(`/keys?${new URLSearchParams({ scope: rtlScope })}`),
      await view(`/key?${new URLSearchParams({ scope: rtlScope, key: spoof })}`),
      await view(`/key?${new URLSearchParams({ scope: rtlScope, key: 'missing-\u202E' })}`),
    ];
    const mark = (code: string) => `<span class="bidi-control" title="${code}: a bidirectional control character, shown instead of applied">${code}</span>`;
    // Raw controls only in attribute values (the filter's input keeps the scope as it is, for the next query), never in text.
    for (const page of pages) expect(page.body.replace(/="[^"]*"/g, '')).not.toMatch(/[\u202A-\u202E\u2066-\u2069]/);
    expect(pages[1]!.body).toContain(`<h2>All keys in scope <bdi>acme-${mark('U+202E')}</bdi></h2>`);
    expect(pages[1]!.body).toContain(`<bdi>refund-${mark('U+202E')}fdp.exe</bdi>`);
    expect(pages[2]!.body).toContain(
      `<h2>Key <code class="key-name"><bdi>refund-${mark('U+202E')}fdp.exe</bdi></code> in scope <code class="scope-name"><bdi>acme-${mark('U+202E')}</bdi></code></h2>`,
    );
    expect(unescape(/data-field="result">([^]*?)<\/pre>/.exec(pages[2]!.body)![1]!)).toContain('"note": "paid \\u2067back\\u2069"');
    expect(pages[3]!.statusCode).toBe(404);
    expect(pages[3]!.body).toContain(`No key <code><bdi>missing-${mark('U+202E')}</bdi></code> in scope <code><bdi>acme-${mark('U+202E')}</bdi></code>`);
    expect((await api.app.inject({ method: 'GET', url: '/ui/inspector.css' })).body).toMatch(/bdi \{ unicode-bidi: isolate; \}/);
  });

  it('lists by status with keyset paging: every key once, in order, even when keys are added and updated between pages', async () => {
    const names = Array.from({ length: 8 }, (_, i) => `p-${String(i).padStart(2, '0')}`);
    for (const name of names) await seed('paging', name, name.endsWith('3') ? 'fail' : 'complete');
    const seen: string[] = [];
    let route: string | undefined = '/keys?status=completed&scope=paging&limit=3';
    const routes: string[] = [];
    while (route) {
      const page = await view(route);
      expect(page.statusCode).toBe(200);
      seen.push(...listedKeys(page.body));
      routes.push(route);
      if (seen.length === 3) {
        // Between pages: a key before the cursor is added, and one after it is updated.
        await seed('paging', 'p-00a', 'complete');
        await sql`update ${table()} set updated_at = now() where scope = 'paging' and key = 'p-07'`.execute(env.db);
      }
      route = pagingLink(page.body, 'next');
    }
    const completed = names.filter((n) => !n.endsWith('3'));
    expect(seen).toEqual(completed);
    expect(routes).toHaveLength(3);
    // And back from the last page: the previous pages, in order.
    const last = await view(routes[2]!);
    const previous = await view(pagingLink(last.body, 'prev')!);
    expect(listedKeys(previous.body)).toEqual(['p-04', 'p-05', 'p-06']);
    // Pages end where their cursor says: the key added before the first cursor now shifts them.
    const second = await view(pagingLink(previous.body, 'prev')!);
    expect(listedKeys(second.body)).toEqual(['p-00a', 'p-01', 'p-02']);
    const first = await view(pagingLink(second.body, 'prev')!);
    expect(listedKeys(first.body)).toEqual(['p-00']);
    expect(pagingLink(first.body, 'prev')).toBeUndefined();
    expect(pagingLink(first.body, 'next')).toBeDefined();
  });
});

describe('key inspector: release', () => {
  it('releases a stuck key with a reason, records who, when and why on the key, logs it; the next claim takes it over', async () => {
    const before = (await keys.get('acme', 'stuck'))!;
    const response = await release({ scope: 'acme', key: 'stuck', reason: 'worker host lost <b>' });
    expect(response.statusCode).toBe(200);
    expect(response.body).toContain('Released by alice (was processing)');
    expect(response.body).toContain('<td class="actor"><bdi>alice</bdi></td><td class="reason"><bdi>worker host lost &#60;b&#62;</bdi></td>');
    const after = (await keys.get('acme', 'stuck'))!;
    expect(after).toMatchObject({ status: 'processing', owner: null, fence: before.fence });
    expect(after.error).toMatchObject({ released_by_operator: true, reason: 'worker host lost <b>', by: 'alice', previous_status: 'processing' });
    expect(await auditOf('acme', 'stuck')).toEqual([
      { action: 'release', actor: 'alice', reason: 'worker host lost <b>', detail: { previous_status: 'processing', fence: before.fence } },
    ]);
    expect(logLines).toContainEqual(
      expect.objectContaining({ msg: 'key released by an operator in the key inspector', operator: 'alice', scope: 'acme', key: 'stuck', reason: 'worker host lost <b>' }),
    );
    const takeover = await keys.claim('acme', 'stuck', keys.fingerprint({ key: 'stuck' }));
    expect(takeover).toMatchObject({ kind: 'taken-over', fence: before.fence + 1 });
    const page = await view(`/key?${new URLSearchParams({ scope: 'acme', key: 'stuck' })}`);
    expect(page.body).toMatch(/data-field="fence">2</);
    expect(page.body).toMatch(/data-field="attempts">2</);
  });

  it('refuses what it must and changes nothing: no reason, a completed key (409), a missing key (404), a form post (415)', async () => {
    const paidBefore = await keys.get('acme', 'paid');
    const noReason = await release({ scope: 'acme', key: 'declined', reason: '  ' });
    expect(noReason.statusCode).toBe(400);
    expect(noReason.body).toContain('Give a reason');
    expect((await keys.get('acme', 'declined'))!.status).toBe('failed');

    const completed = await release({ scope: 'acme', key: 'paid', reason: 'try again' });
    expect(completed.statusCode).toBe(409);
    expect(completed.body).toContain('Not released: the key is completed');
    expect(await keys.get('acme', 'paid')).toEqual(paidBefore);

    const missing = await release({ scope: 'acme', key: 'nope', reason: 'x' });
    expect(missing.statusCode).toBe(404);

    // What a cross-site HTML form can send (no JSON) is refused before anything is read.
    const form = await api.app.inject({
      method: 'POST',
      url: '/ui/view/release',
      headers: { ...auth(ADMIN), 'content-type': 'application/x-www-form-urlencoded' },
      payload: 'scope=acme&key=declined&reason=csrf',
    });
    expect(form.statusCode).toBe(415);
    expect((await keys.get('acme', 'declined'))!.status).toBe('failed');
    expect(await auditOf('acme', 'declined')).toEqual([]);
    expect(await auditOf('acme', 'paid')).toEqual([]);
  });
});

describe('schedules in the HTTP API', () => {
  it('lists the schedules and answers one with its last and next tick, for an operator only; 404 and 400 for a name that is none', async () => {
    const schedules = new Schedules({ db: env.db, schema: env.schema });
    await schedules.upsert({ name: 'http-nightly', cron: '0 2 * * *', timezone: 'Europe/Paris', queue: 'payments', data: { report: 'daily' } });
    await schedules.upsert({ name: 'http-rates', every: 60_000, queue: 'payments' });
    try {
      const list = await api.app.inject({ url: '/schedules', headers: auth(ADMIN) });
      expect(list.statusCode).toBe(200);
      const listed = list.json() as { schedules: Array<Record<string, unknown>> };
      expect(listed.schedules.map((s) => s.name)).toEqual(['http-nightly', 'http-rates']);

      const one = await api.app.inject({ url: '/schedules/http-nightly', headers: auth(ADMIN) });
      expect(one.statusCode).toBe(200);
      const nightly = one.json() as Record<string, unknown>;
      expect(nightly).toMatchObject({ name: 'http-nightly', kind: 'cron', spec: '0 2 * * *', timezone: 'Europe/Paris', queue: 'payments', data: { report: 'daily' }, lastTick: null });
      const expected = (await schedules.get('http-nightly'))!.nextTick!.toISOString();
      expect(nightly.nextTick).toBe(expected);

      // A tenant's token, or none, does not read the service's schedules.
      expect((await api.app.inject({ url: '/schedules', headers: auth(TENANT) })).statusCode).toBe(401);
      expect((await api.app.inject({ url: '/schedules' })).statusCode).toBe(401);
      const missing = await api.app.inject({ url: '/schedules/nope', headers: auth(ADMIN) });
      expect(missing.statusCode).toBe(404);
      expect(missing.headers['content-type']).toMatch(/application\/problem\+json/);
      expect((await api.app.inject({ url: `/schedules/${'x'.repeat(300)}`, headers: auth(ADMIN) })).statusCode).toBe(400);
    } finally {
      await schedules.remove('http-nightly');
      await schedules.remove('http-rates');
    }
  });

  it("a tick's key page in the inspector shows its schedule: spec, last and next tick; or that it was removed", async () => {
    const schedules = new Schedules({ db: env.db, schema: env.schema });
    const info = await schedules.upsert({ name: 'ui-hourly', every: 3_600_000, queue: 'payments' });
    await seed(scheduleScope('ui-hourly'), '2026-12-02T04:00:00.000Z', 'complete');
    const url = `/ui/view/key?scope=${encodeURIComponent(scheduleScope('ui-hourly'))}&key=${encodeURIComponent('2026-12-02T04:00:00.000Z')}`;
    const page = await api.app.inject({ url, headers: auth(ADMIN) });
    expect(page.statusCode).toBe(200);
    expect(page.body).toMatch(/<h3>Schedule<\/h3>/);
    expect(page.body).toMatch(/data-field="schedule-spec">every 1h</);
    expect(page.body).toContain(`data-field="schedule-next-tick">${info.nextTick!.toISOString().replace('.000Z', 'Z')}<`);
    await schedules.remove('ui-hourly');
    const removed = await api.app.inject({ url, headers: auth(ADMIN) });
    expect(removed.body).toMatch(/a schedule that has since been removed/);
    // Other keys show no schedule.
    expect((await api.app.inject({ url: '/ui/view/key?scope=acme&key=paid', headers: auth(ADMIN) })).body).not.toMatch(/<h3>Schedule<\/h3>/);
  });
});
