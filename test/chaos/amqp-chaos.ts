/**
 * The chaos suite against RabbitMQ (`npm run chaos -- --broker amqp`): consumer processes
 * reach the shared broker through a TCP proxy; a nemesis SIGKILLs consumers (respawned),
 * pauses them past their lease (SIGSTOP, SIGCONT), cuts every broker connection at the proxy,
 * and has the broker close a consumer's channel. The producer publishes with confirms, a share
 * of keys more than once. After the faults stop and the queue drains, the same checker as the
 * BullMQ suite decides: nothing lost, duplicated or unexpected.
 *
 * Postgres is the shared server with a schema of the run's own; RabbitMQ is the shared broker
 * with queues of the run's own; both are removed at the end.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { connect } from 'amqplib';
import { sql } from 'kysely';
import { amqpTopology } from '../../src/amqp/amqp-topology.js';
import { createPostgresDb, migrate } from '../../src/index.js';
import { checkHistory, type ExecutionRow, type KeyRow } from './checker.js';
import { createChaosTables, type ChaosPayload } from './chaos-handler.js';
import { seededRandom } from './random.js';
import { startTcpProxy } from './tcp-proxy.js';
import type { WorkerExit, WorkerLogLine } from './worker-fleet.js';

const USAGE = `Usage: npm run chaos -- --broker amqp [flags]
  --seed N               seed of the fault schedule and the producer (default: random, printed)
  --jobs N               messages published, duplicates included (default 2000)
  --minutes M            length of the chaos phase (default 1)
  --consumers K          consumer processes (default 3)
  --concurrency C        messages at once per consumer (default 4)
  --lease-ms MS          lease (default 2000)
  --fault-interval-ms MS mean time between faults (default 2500)
  --drain-minutes M      how long the queue may take to drain after the faults stop (default 1.5)

DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres) and AMQP_URL (default
amqp://guest:guest@127.0.0.1:5672) name the shared servers; the run uses a schema and queues of
its own and removes them. The TCP proxy listens on a port in 15600–15649.`;

const PROXY_PORTS = Array.from({ length: 50 }, (_, i) => 15_600 + i);
const CONSUMER_SCRIPT = fileURLToPath(new URL('./amqp-chaos-consumer.ts', import.meta.url));

type Fault = 'kill' | 'pause' | 'cut-connections' | 'close-channel';
const FAULTS: readonly Fault[] = ['kill', 'pause', 'cut-connections', 'close-channel'];

interface Options {
  seed: number;
  jobs: number;
  durationMs: number;
  consumers: number;
  concurrency: number;
  leaseMs: number;
  faultIntervalMs: number;
  drainMs: number;
}

function parseOptions(argv: string[]): Options | undefined {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      broker: { type: 'string' },
      seed: { type: 'string' },
      jobs: { type: 'string' },
      minutes: { type: 'string' },
      consumers: { type: 'string' },
      concurrency: { type: 'string' },
      'lease-ms': { type: 'string' },
      'fault-interval-ms': { type: 'string' },
      'drain-minutes': { type: 'string' },
      help: { type: 'boolean' },
    },
  });
  if (values.help) return undefined;
  const number = (raw: string | undefined, fallback: number, min: number, flag: string) => {
    if (raw === undefined) return fallback;
    const value = Number(raw);
    if (!Number.isFinite(value) || value < min) throw new Error(`--${flag}: expected a number ≥ ${min}, got "${raw}"`);
    return value;
  };
  return {
    seed: number(values.seed, Math.floor(Math.random() * 2 ** 31), 0, 'seed'),
    jobs: number(values.jobs, 2_000, 1, 'jobs'),
    durationMs: number(values.minutes, 1, 0.05, 'minutes') * 60_000,
    consumers: number(values.consumers, 3, 1, 'consumers'),
    concurrency: number(values.concurrency, 4, 1, 'concurrency'),
    leaseMs: number(values['lease-ms'], 2_000, 300, 'lease-ms'),
    faultIntervalMs: number(values['fault-interval-ms'], 2_500, 100, 'fault-interval-ms'),
    drainMs: number(values['drain-minutes'], 1.5, 0.1, 'drain-minutes') * 60_000,
  };
}

const log = (line: string) => console.log(`[chaos:amqp] ${new Date().toISOString().slice(11, 19)} ${line}`);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Runs the suite; resolves to the process exit code (0 pass, 1 a check failed, 2 bad flags). */
export async function runAmqpChaos(argv: string[]): Promise<number> {
  let options;
  try {
    options = parseOptions(argv);
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (!options) {
    console.log(USAGE);
    return 0;
  }
  const rng = seededRandom(options.seed);
  const random = () => rng.next();
  const suffix = randomBytes(4).toString('hex');
  const schema = `chaos_amqp_${suffix}`;
  const queue = `chaos.amqp.${suffix}`;
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const amqpUrl = new URL(process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672');
  log(`seed ${options.seed} (reproduce with --seed ${options.seed}); ${options.jobs} messages, ${options.consumers} consumers × ${options.concurrency}, lease ${options.leaseMs} ms`);

  const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 4, applicationName: 'chaos-amqp-harness' }, () => {});
  await migrate(db, { schema });
  await createChaosTables(db, schema);
  const proxy = await startTcpProxy({ host: amqpUrl.hostname, port: Number(amqpUrl.port || 5672) }, PROXY_PORTS);
  const proxiedUrl = new URL(amqpUrl);
  proxiedUrl.hostname = '127.0.0.1';
  proxiedUrl.port = String(proxy.port);
  const producerConnection = await connect(amqpUrl.toString());
  const producer = await producerConnection.createConfirmChannel();
  await producer.assertQueue(queue, { durable: true });

  const lines: WorkerLogLine[] = [];
  const exits: WorkerExit[] = [];
  const slots: (ChildProcess | undefined)[] = [];
  let stopping = false;
  const spawnConsumer = (slot: number) => {
    const child = spawn(process.execPath, ['--import', 'tsx', CONSUMER_SCRIPT], {
      env: { ...process.env, DATABASE_URL: databaseUrl, SCHEMA: schema, AMQP_URL: proxiedUrl.toString(), QUEUE: queue, CONCURRENCY: String(options.concurrency), LEASE_MS: String(options.leaseMs) },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let ready = false;
    createInterface({ input: child.stdout! }).on('line', (text) => {
      try {
        const line = JSON.parse(text) as WorkerLogLine;
        if (line.msg === 'worker ready') ready = true;
        lines.push(line);
      } catch {
        // Not a log line.
      }
    });
    child.once('exit', (code, signal) => {
      exits.push({ pid: child.pid!, slot, at: Date.now(), code, signal, beforeReady: !ready });
      if (slots[slot] === child) slots[slot] = undefined;
    });
    slots[slot] = child;
  };
  for (let slot = 0; slot < options.consumers; slot++) spawnConsumer(slot);

  // Producer: unique keys, a fifth of the messages repeating an earlier key.
  const produced = new Map<string, { acks: number }>();
  const publishing = (async () => {
    let next = 0;
    const payloads = new Map<number, ChaosPayload>();
    for (let i = 0; i < options.jobs; i++) {
      const n = next > 0 && random() < 0.2 ? Math.floor(random() * next) : next++;
      const key = `k${n}`;
      // A repeat carries the same payload (another one would be refused as key reuse).
      const payload: ChaosPayload = payloads.get(n) ?? { n, workMs: Math.floor(random() * 200) };
      payloads.set(n, payload);
      const body = Buffer.from(JSON.stringify({ idempotencyKey: key, scope: 'chaos', payload }));
      if (!produced.has(`chaos/${key}`)) produced.set(`chaos/${key}`, { acks: 0 });
      await new Promise<void>((resolve, reject) =>
        producer.sendToQueue(queue, body, { persistent: true, contentType: 'application/json' }, (error) => (error ? reject(error) : resolve())),
      );
      produced.get(`chaos/${key}`)!.acks++;
      if (i % 50 === 0) await sleep((options.durationMs * 0.6) / (options.jobs / 50));
    }
  })();

  // Nemesis.
  const faults: Record<Fault, number> = { kill: 0, pause: 0, 'cut-connections': 0, 'close-channel': 0 };
  const chaosEnd = Date.now() + options.durationMs;
  while (Date.now() < chaosEnd) {
    await sleep(options.faultIntervalMs * (0.5 + random()));
    const fault = FAULTS[Math.floor(random() * FAULTS.length)]!;
    const slot = Math.floor(random() * options.consumers);
    const victim = slots[slot];
    faults[fault]++;
    switch (fault) {
      case 'kill':
        victim?.kill('SIGKILL');
        setTimeout(() => !stopping && spawnConsumer(slot), 500);
        break;
      case 'pause':
        // Past the lease: another consumer takes the key over; the paused one is fenced when it wakes.
        victim?.kill('SIGSTOP');
        setTimeout(() => victim?.kill('SIGCONT'), options.leaseMs * 1.5);
        break;
      case 'cut-connections':
        log(`cut ${proxy.dropConnections()} broker connections`);
        break;
      case 'close-channel':
        victim?.kill('SIGUSR2');
        break;
    }
  }
  await publishing;
  await sleep(options.leaseMs * 1.5 + 500); // the last pause has ended
  log(`faults stopped: ${JSON.stringify(faults)}; draining`);

  const readKeys = async () => (await sql<KeyRow>`select scope, key, status, fence::int from ${sql.id(schema, 'idempotency_keys')}`.execute(db)).rows;
  const drainEnd = Date.now() + options.drainMs;
  const topology = amqpTopology(queue);
  const queuedMessages = async () => {
    let total = 0;
    for (const name of [queue, ...topology.delayQueues]) {
      const channel = await producerConnection.createChannel();
      channel.on('error', () => {});
      total += await channel.checkQueue(name).then((q) => q.messageCount, () => 0);
      await channel.close().catch(() => {});
    }
    return total;
  };
  for (;;) {
    const keys = await readKeys();
    const completed = keys.filter((row) => row.status === 'completed').length;
    const queued = await queuedMessages();
    if ((completed === produced.size && queued === 0) || Date.now() > drainEnd) break;
    await sleep(1_000);
  }
  stopping = true;
  const stoppedAt = Date.now();
  await Promise.all(
    slots.map(async (child) => {
      if (!child || child.exitCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await Promise.race([exited, sleep(10_000).then(() => child.kill('SIGKILL'))]);
    }),
  );

  const rows = async (table: string) =>
    (await sql<ExecutionRow>`select scope, key, fence::int, worker_pid as "workerPid", extract(epoch from at) * 1000 as at from ${sql.id(schema, table)}`.execute(db)).rows.map(
      (row) => ({ ...row, at: Number(row.at) }),
    );
  const keys = await readKeys();
  const deadLettered = await new Promise<number>((resolve) => {
    void producerConnection.createChannel().then(async (channel) => {
      channel.on('error', () => {});
      resolve(await channel.checkQueue(topology.deadLetterQueue).then((q) => q.messageCount, () => 0));
      await channel.close().catch(() => {});
    });
  });
  const pending = new Set(keys.filter((row) => row.status !== 'completed').map((row) => `${row.scope}/${row.key}`));
  const result = checkHistory({
    produced,
    effects: await rows('effects'),
    externalCalls: await rows('external_calls'),
    keys,
    lines,
    exits,
    stoppedAt,
    pending: (await queuedMessages()) > 0 ? pending : new Set(),
  });
  log(`outcomes ${JSON.stringify(result.outcomes)}`);
  const verdict = {
    acknowledgedKeys: result.acknowledgedKeys,
    lost: result.lost.length,
    duplicated: result.duplicated.length,
    unexpected: result.unexpected.length,
    unfinished: result.unfinished.length,
    leftProcessing: result.leftProcessing.length,
    failedKeys: result.failedKeys.length,
    deadLettered,
    committedOverlaps: result.committedOverlaps.length,
    fenceMismatches: result.fenceMismatches.length,
    kills: exits.filter((exit) => exit.signal === 'SIGKILL').length,
    faults,
  };
  log(`verdict ${JSON.stringify(verdict)}`);
  const failed =
    verdict.lost + verdict.duplicated + verdict.unexpected + verdict.unfinished + verdict.leftProcessing + verdict.failedKeys + verdict.deadLettered + verdict.committedOverlaps + verdict.fenceMismatches >
    0;

  // Cleanup: the run's queues and schema.
  for (const name of [queue, topology.deadLetterQueue, ...topology.delayQueues]) {
    const channel = await producerConnection.createChannel();
    channel.on('error', () => {});
    await channel.deleteQueue(name).catch(() => {});
    await channel.close().catch(() => {});
  }
  await producerConnection.close().catch(() => {});
  await proxy.close();
  await sql`drop schema ${sql.id(schema)} cascade`.execute(db);
  await db.destroy();
  log(failed ? `FAILED (seed ${options.seed})` : 'PASS: nothing lost, duplicated or unexpected');
  return failed ? 1 : 0;
}
