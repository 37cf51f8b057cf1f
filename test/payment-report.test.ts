// @module-tag redis
/**
 * The demo's multi-step payment (workers/payments) and its report (demo/payment-report.ts):
 * workers that stop inside the charge and inside the e-mail are taken over; the report finds
 * where each stopped and resumed, one charge and one extra e-mail, and no problem.
 */
import { randomUUID } from 'node:crypto';
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatPaymentReport, paymentReport } from '../demo/payment-report.js';
import { IdempotencyKeys, createIdempotentWorker, type IdempotentWorker } from '../src/index.js';
import { SimulatedMailer, SimulatedPaymentProvider, createPaymentsTables, paymentHandler, type ChargePayload } from '../workers/payments/payments-domain.js';
import { createGate, expireLease } from './support/protocol-fixtures.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const QUEUE = 'demo-payments';
let env: TestEnv;
let queue: Queue;
let worker: IdempotentWorker<ChargePayload, unknown> | undefined;

beforeAll(async () => {
  env = await createTestEnv('payment_report');
  await createPaymentsTables(env.db, env.schema);
  queue = new Queue(QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
});
afterAll(async () => {
  await worker?.close({ force: true });
  await queue?.close();
  await env?.teardown();
});

describe('demo payments report', () => {
  it('finds where taken-over keys stopped and resumed, and explains every repeated e-mail', async () => {
    // Keys whose claims stop, as if their worker died, right after the named system was called:
    // the first claim of each, and the second too of a key that changes hands twice.
    const stopAfter = new Map([
      ['stops-in-charge', { where: 'charge', fences: [1] }],
      ['stops-in-email', { where: 'email', fences: [1] }],
      ['stops-in-email-twice', { where: 'email', fences: [1, 2] }],
    ]);
    const gate = createGate();
    const reached = new Set<string>();
    const stop = async (key: string, fence: number, where: string) => {
      const stops = stopAfter.get(key);
      if (stops?.where !== where || !stops.fences.includes(fence)) return;
      reached.add(`${key}@${fence}`);
      await gate.wait;
    };
    class StoppingProvider extends SimulatedPaymentProvider {
      override async charge(request: Parameters<SimulatedPaymentProvider['charge']>[0]) {
        const charge = await super.charge(request);
        await stop(request.caller.key, request.caller.fence, 'charge');
        return charge;
      }
    }
    class StoppingMailer extends SimulatedMailer {
      override async send(message: Parameters<SimulatedMailer['send']>[0]) {
        const sent = await super.send(message);
        await stop(message.caller.key, message.caller.fence, 'email');
        return sent;
      }
    }
    worker = createIdempotentWorker<ChargePayload>({
      queue: QUEUE,
      connection: { url: env.redisUrl },
      prefix: env.redisPrefix,
      keys: new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000 }),
      // Four runs wait at the gate at once: room for the runs that take their keys over.
      concurrency: 8,
      logger: pino({ level: 'silent' }),
      handler: paymentHandler(env.db, new StoppingProvider(env.db, env.schema), new StoppingMailer(env.db, env.schema), env.schema),
    });
    const add = (key: string) =>
      queue.add('charge', { idempotencyKey: key, scope: 'demo', payload: { orderId: key, cents: 500 } }, { jobId: `job-${randomUUID()}` });

    const plain = await add('plain');
    const stopped = [await add('stops-in-charge'), await add('stops-in-email'), await add('stops-in-email-twice')];
    await waitForJobState(queue, plain.id!, ['completed']);
    await waitFor('the three keys to stop', async () => reached.size === 3);
    // Their leases run out; duplicates take them over and finish them, but for the key that
    // stops twice: its second owner stops inside the e-mail too, and a third one finishes it.
    const resumed: Awaited<ReturnType<typeof add>>[] = [];
    for (const key of stopAfter.keys()) {
      await expireLease(env.db, env.schema, 'demo', key);
      const job = await add(key);
      (key === 'stops-in-email-twice' ? stopped : resumed).push(job);
    }
    await waitFor('the second owner of stops-in-email-twice to stop', async () => reached.has('stops-in-email-twice@2'));
    await expireLease(env.db, env.schema, 'demo', 'stops-in-email-twice');
    resumed.push(await add('stops-in-email-twice'));
    for (const job of resumed) await waitForJobState(queue, job.id!, ['completed']);
    // The stopped workers wake up as zombies; the report is read once their jobs have settled
    // (each zombie's run refused, its job then replaying the key's result).
    gate.open();
    for (const job of stopped) await waitForJobState(queue, job.id!, ['completed']);

    const report = await paymentReport(env.db, env.schema);
    expect(report.problems).toEqual([]);
    expect(report.duplicatedKeys).toBe(0);
    // One extra e-mail for the key that changed hands once, two for the one that changed hands
    // twice: every owner before the last sent one.
    expect(report.emailRepeats).toBe(3);
    expect(report.steps.map((s) => [s.step, s.calls, s.effects])).toEqual([
      ['reserve', 4, 4],
      ['charge', 5, 4],
      // 5 calls: the zombie stopped in the charge wakes up and calls ledger; the charge's record,
      // held for that round trip, is refused in front of ledger's transaction, so none of its
      // statements run (4 effects) and it fails with LeaseLostError.
      ['ledger', 5, 4],
      ['email', 7, 7],
      ['completion', 4, 4],
    ]);
    expect(report.resumptions.map((r) => [r.key, r.stoppedAt, r.inside, r.resumedAt, r.lostFence, r.fence, r.callsBeforeTakeover]).sort()).toEqual([
      ['stops-in-charge', 'charge', true, 'charge', 1, 2, 1],
      ['stops-in-email', 'email', true, 'email', 1, 2, 1],
      ['stops-in-email-twice', 'email', true, 'email', 2, 3, 1],
    ]);
    const text = formatPaymentReport(report, undefined);
    expect(text).toContain('keys taken over: 3');
    expect(text).toMatch(/demo\/stops-in-charge\s+stopped inside charge \(fence 1, pid \d+\) → resumed at charge \(fence 2, pid \d+\): reserve replayed; charge called again, the provider deduplicated it$/m);
    expect(text).toMatch(/demo\/stops-in-email\s+stopped inside email \(fence 1, pid \d+\) → resumed at email \(fence 2, pid \d+\): reserve, charge, ledger replayed; e-mail sent again/);

    // A database effect twice is a problem the report names.
    await sql`insert into ${sql.id(env.schema, 'ledger')} (scope, key, fence, worker_pid, order_id, cents, charge_id)
              values ('demo', 'plain', 1, 0, 'plain', 500, 'ch_x')`.execute(env.db);
    expect((await paymentReport(env.db, env.schema)).problems).toEqual(['1 key has a database effect more than once']);
  });
});
