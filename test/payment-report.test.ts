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
    // Keys whose first claim stops, as if its worker died, right after the named system was called.
    const stopAfter = new Map([
      ['stops-in-charge', 'charge'],
      ['stops-in-email', 'email'],
    ]);
    const gate = createGate();
    const reached = new Set<string>();
    const stop = async (key: string, fence: number, where: string) => {
      if (fence !== 1 || stopAfter.get(key) !== where) return;
      reached.add(key);
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
      concurrency: 4,
      logger: pino({ level: 'silent' }),
      handler: paymentHandler(env.db, new StoppingProvider(env.db, env.schema), new StoppingMailer(env.db, env.schema), env.schema),
    });
    const add = (key: string) =>
      queue.add('charge', { idempotencyKey: key, scope: 'demo', payload: { orderId: key, cents: 500 } }, { jobId: `job-${randomUUID()}` });

    const plain = await add('plain');
    const stopped = [await add('stops-in-charge'), await add('stops-in-email')];
    await waitForJobState(queue, plain.id!, ['completed']);
    await waitFor('both keys to stop', async () => reached.size === 2);
    // Their leases run out; duplicates take them over and finish them.
    const resumed = [];
    for (const key of stopAfter.keys()) {
      await expireLease(env.db, env.schema, 'demo', key);
      resumed.push(await add(key));
    }
    for (const job of resumed) await waitForJobState(queue, job.id!, ['completed']);
    // The stopped workers wake up as zombies; the report is read once their jobs have settled
    // (each zombie's run refused, its job then replaying the key's result).
    gate.open();
    for (const job of stopped) await waitForJobState(queue, job.id!, ['completed']);

    const report = await paymentReport(env.db, env.schema);
    expect(report.problems).toEqual([]);
    expect(report.duplicatedKeys).toBe(0);
    expect(report.emailRepeats).toBe(1);
    expect(report.steps.map((s) => [s.step, s.calls, s.effects])).toEqual([
      ['reserve', 3, 3],
      ['charge', 4, 3],
      // 4 calls: the zombie stopped in the charge wakes up and calls ledger; the charge's record,
      // held for that round trip, is refused in front of ledger's transaction, so none of its
      // statements run (3 effects) and it fails with LeaseLostError.
      ['ledger', 4, 3],
      ['email', 4, 4],
      ['completion', 3, 3],
    ]);
    expect(report.resumptions.map((r) => [r.key, r.stoppedAt, r.inside, r.resumedAt, r.lostFence, r.fence, r.callsBeforeTakeover]).sort()).toEqual([
      ['stops-in-charge', 'charge', true, 'charge', 1, 2, 1],
      ['stops-in-email', 'email', true, 'email', 1, 2, 1],
    ]);
    const text = formatPaymentReport(report, undefined);
    expect(text).toContain('keys taken over: 2');
    expect(text).toMatch(/demo\/stops-in-charge\s+stopped inside charge \(fence 1, pid \d+\) → resumed at charge \(fence 2, pid \d+\): reserve replayed; charge called again, the provider deduplicated it$/m);
    expect(text).toMatch(/demo\/stops-in-email\s+stopped inside email \(fence 1, pid \d+\) → resumed at email \(fence 2, pid \d+\): reserve, charge, ledger replayed; e-mail sent again/);

    // A database effect twice is a problem the report names.
    await sql`insert into ${sql.id(env.schema, 'ledger')} (scope, key, fence, worker_pid, order_id, cents, charge_id)
              values ('demo', 'plain', 1, 0, 'plain', 500, 'ch_x')`.execute(env.db);
    expect((await paymentReport(env.db, env.schema)).problems).toEqual(['1 keys have a database effect more than once']);
  });
});
