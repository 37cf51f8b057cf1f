/**
 * The chaos suite against NATS JetStream (`npm run chaos -- --broker nats`): consumer processes
 * (the library's NATS consumer process with the chaos handler) take messages from a stream on a
 * private nats-server while a nemesis kills them (SIGKILL), pauses them mid-message past their
 * lease (SIGSTOP/SIGCONT), cuts one consumer's connections (a TCP proxy in front of each),
 * kills and restarts the broker, and crashes them at protocol points. Then the system drains and
 * the same checker as the BullMQ suite's reads what happened: lost, duplicated and unexpected
 * effects must be 0, and no key may be left processing or failed.
 *
 * Postgres is the machine's (DATABASE_URL) with a schema of the run's own, dropped at the end;
 * the nats-server is private (port 14200–14299, its own store directory), deleted at the end.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import { fileURLToPath } from 'node:url';
import { createPostgresDb, migrate, toWireJobData } from '../../src/index.js';
import { ensureJetStreamConsumer } from '../../src/nats/index.js';
import { PrivateNats } from '../support/private-nats.js';
import { createChaosTables } from './chaos-handler.js';
import { checkHistory, type CheckResult, type ExecutionRow, type KeyRow } from './checker.js';
import { seededRandom } from './random.js';
import { startTcpProxy, type TcpProxy } from './tcp-proxy.js';

const ENTRY = fileURLToPath(new URL('./nats-chaos-consumer.ts', import.meta.url));
const STREAM = 'CHAOS';
const CONSUMER = 'chaos';

export interface NatsChaosOptions {
  readonly seed: number;
  readonly jobs: number;
  readonly durationMs: number;
  readonly consumers: number;
  readonly concurrency: number;
  readonly duplicateRatio: number;
  readonly leaseMs: number;
  readonly faultIntervalMs: number;
  readonly maxWorkMs: number;
  readonly faultPoints: string;
  readonly drainTimeoutMs: number;
  readonly log: (line: string) => void;
}

type Fault = 'kill' | 'pause' | 'cut-connection' | 'broker-restart' | 'arm-before-commit' | 'arm-after-commit';
const FAULTS: readonly Fault[] = ['kill', 'pause', 'cut-connection', 'broker-restart', 'arm-before-commit', 'arm-after-commit'];

interface Slot {
  child: ChildProcess | undefined;
  readonly proxy: TcpProxy;
}

/** Runs the suite; resolves to the checker's verdict and the faults done. */
export async function runNatsChaos(options: NatsChaosOptions): Promise<{ result: CheckResult; faults: Record<string, number> }> {
  const random = seededRandom(options.seed);
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const schema = `chaos_nats_${randomBytes(4).toString('hex')}`;
  const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 4 }, () => {});
  const server = await PrivateNats.start();
  const slots: Slot[] = [];
  let stopping = false;
  try {
    await migrate(db, { schema });
    await createChaosTables(db, schema);
    const admin = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 200 });
    await ensureJetStreamConsumer(admin, {
      stream: STREAM,
      subjects: ['chaos.>'],
      consumer: CONSUMER,
      ackWaitMs: 2 * options.leaseMs,
      deadLetter: { stream: `${STREAM}_DEAD_LETTERS`, subject: `dead-letters.${STREAM}.${CONSUMER}` },
    });
    const env = {
      ...process.env,
      DATABASE_URL: databaseUrl,
      SCHEMA: schema,
      LEASE_MS: String(options.leaseMs),
      CONCURRENCY: String(options.concurrency),
      SHUTDOWN_TIMEOUT_MS: '2000',
      STORE_RETRY_MAX_MS: '1000',
      NATS_STREAM: STREAM,
      NATS_CONSUMER: CONSUMER,
      FAULT_POINTS: options.faultPoints,
      LOG_LEVEL: process.env.CHAOS_LOG_LEVEL ?? 'warn',
      MIGRATE: 'false',
    };
    const spawnConsumer = (slot: Slot, index: number) => {
      const child = spawn(process.execPath, ['--import', 'tsx', ENTRY], {
        env: { ...env, NATS_URL: `127.0.0.1:${slot.proxy.port}`, FAULT_SEED: String(options.seed + index + Date.now() % 1000) },
        stdio: ['ignore', process.env.CHAOS_CONSUMER_LOGS ? 'inherit' : 'ignore', 'inherit', 'ipc'],
      });
      slot.child = child;
      child.on('error', (error) => options.log(`consumer ${index} could not start: ${error.message}`));
      child.once('exit', (code, signal) => {
        if (!stopping) options.log(`consumer ${index} (pid ${child.pid}) exited (${signal ?? code}); starting another`);
        if (slot.child === child) slot.child = undefined;
        if (!stopping) setTimeout(() => !stopping && slot.child === undefined && spawnConsumer(slot, index), 200).unref();
      });
    };
    for (let i = 0; i < options.consumers; i++) {
      const slot: Slot = { child: undefined, proxy: await startTcpProxy({ host: '127.0.0.1', port: server.port }, [0]) };
      slots.push(slot);
      spawnConsumer(slot, i);
    }

    // The producer: every key once, some twice (a publisher's retry), acknowledged by JetStream.
    const produced = new Map<string, { acks: number }>();
    const js = jetstream(admin);
    const producing = (async () => {
      const pauseMs = options.durationMs / options.jobs;
      for (let n = 0; n < options.jobs; n++) {
        const key = `k-${n}`;
        const payload = { n, workMs: random.int(0, options.maxWorkMs) };
        const entry = produced.get(`chaos/${key}`) ?? { acks: 0 };
        produced.set(`chaos/${key}`, entry);
        const copies = random.next() < options.duplicateRatio ? 2 : 1;
        for (let copy = 0; copy < copies; copy++) {
          const body = new TextEncoder().encode(JSON.stringify(toWireJobData('chaos', key, payload)));
          for (let tries = 0; tries < 50; tries++) {
            try {
              await js.publish(`chaos.${n % 8}`, body, { timeout: 2_000 });
              entry.acks++;
              break;
            } catch {
              await sleep(200); // the broker is restarting: publish again (JetStream may store both)
            }
          }
        }
        await sleep(pauseMs);
      }
    })();

    // The nemesis.
    const faults: Record<string, number> = {};
    const deadline = Date.now() + options.durationMs;
    while (Date.now() < deadline) {
      await sleep(Math.round(options.faultIntervalMs * (0.5 + random.next())));
      const fault = FAULTS[random.int(0, FAULTS.length - 1)]!;
      const slot = slots[random.int(0, slots.length - 1)]!;
      faults[fault] = (faults[fault] ?? 0) + 1;
      options.log(`fault: ${fault}`);
      switch (fault) {
        case 'kill':
          slot.child?.kill('SIGKILL');
          break;
        case 'pause': {
          const child = slot.child;
          child?.kill('SIGSTOP');
          setTimeout(() => child?.kill('SIGCONT'), Math.round(options.leaseMs * (1.5 + random.next()))).unref();
          break;
        }
        case 'cut-connection':
          slot.proxy.dropConnections();
          break;
        case 'broker-restart':
          await server.restart(300 + random.int(0, 700));
          break;
        case 'arm-before-commit':
          slot.child?.send?.({ arm: 'before-commit' });
          break;
        case 'arm-after-commit':
          slot.child?.send?.({ arm: 'after-commit' });
          break;
      }
    }
    await producing;
    for (const slot of slots) slot.child?.kill('SIGCONT');

    // Drain: every acknowledged key completed and nothing left in the consumer.
    options.log('faults stopped; draining');
    const jsm = await jetstreamManager(admin);
    const drainDeadline = Date.now() + options.drainTimeoutMs;
    const pendingKeys = async () => {
      const { rows } = await sql<{ n: string }>`select count(*) as n from ${sql.id(schema, 'idempotency_keys')} where status = 'completed'`.execute(db);
      return produced.size - Number(rows[0]!.n);
    };
    for (;;) {
      const info = await jsm.consumers.info(STREAM, CONSUMER).catch(() => undefined);
      const notCompleted = await pendingKeys();
      if (info && info.num_pending === 0 && info.num_ack_pending === 0 && notCompleted === 0) break;
      if (Date.now() > drainDeadline) {
        options.log(`drain timed out: ${notCompleted} keys not completed, consumer pending ${info?.num_pending} / unacked ${info?.num_ack_pending}`);
        break;
      }
      await sleep(500);
    }
    const stoppedAt = Date.now();
    stopping = true;
    await Promise.all(slots.map(async (slot) => {
      const child = slot.child;
      if (!child || child.exitCode !== null) return;
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }));
    const deadLetters = (await jsm.streams.info(`${STREAM}_DEAD_LETTERS`)).state.messages;
    const remaining = await jsm.consumers.info(STREAM, CONSUMER);
    await admin.close();

    const rowsOf = async (table: string): Promise<ExecutionRow[]> => {
      const { rows } = await sql<{ scope: string; key: string; fence: string; worker_pid: number; at: string }>`
        select scope, key, fence, worker_pid, extract(epoch from at) * 1000 as at from ${sql.id(schema, table)}`.execute(db);
      return rows.map((r) => ({ scope: r.scope, key: r.key, fence: Number(r.fence), workerPid: r.worker_pid, at: Number(r.at) }));
    };
    const { rows: keyRows } = await sql<{ scope: string; key: string; status: string; fence: string }>`
      select scope, key, status, fence from ${sql.id(schema, 'idempotency_keys')}`.execute(db);
    const keys: KeyRow[] = keyRows.map((r) => ({ scope: r.scope, key: r.key, status: r.status, fence: Number(r.fence) }));
    const pending = remaining.num_pending + remaining.num_ack_pending > 0 ? new Set(keys.filter((k) => k.status !== 'completed').map((k) => `${k.scope}/${k.key}`)) : new Set<string>();
    const result = checkHistory({
      produced,
      effects: await rowsOf('effects'),
      externalCalls: await rowsOf('external_calls'),
      keys,
      lines: [],
      exits: [],
      stoppedAt,
      pending,
      failedJobs: [],
    });
    if (deadLetters > 0) {
      options.log(`${deadLetters} messages were dead-lettered: the chaos handler never fails, so each is a message given up on`);
      return { result: { ...result, ok: false }, faults };
    }
    return { result, faults };
  } finally {
    stopping = true;
    for (const slot of slots) {
      slot.child?.kill('SIGKILL');
      await slot.proxy.close().catch(() => {});
    }
    await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db).catch(() => {});
    await db.destroy();
    await server.destroy();
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
