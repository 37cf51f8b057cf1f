/**
 * Every options object a user passes, through each entry point, refuses a misspelt name with
 * where it was passed and the closest known name (what plain JavaScript gets instead of the
 * type checker's "did you mean"), and `backend` refuses a value that names no backend. Each
 * is refused before anything connects, so no service is needed.
 */
import { describe, expect, it } from 'vitest';
import { createAmqpConsumer } from '../src/amqp/index.js';
import { closestName, editDistance } from '../src/config/unknown-options.js';
import { drizzleDataLayer } from '../src/drizzle/index.js';
import {
  IdempotencyKeys,
  IdempotentProducer,
  KeyedJobRunner,
  OutboxRelay,
  Schedules,
  ValidationError,
  createHttpApi,
  createIdempotentWorker,
  createPostgresDb,
  migrate,
} from '../src/index.js';
import { IdempotentRequests } from '../src/http-idempotency/index.js';
import { knexDataLayer } from '../src/knex/index.js';
import { mikroOrmDataLayer } from '../src/mikro-orm/index.js';
import { createIdempotentNatsConsumer } from '../src/nats/index.js';
import { startTracingFromEnv } from '../src/otel/index.js';
import { pgDataLayer } from '../src/pg/index.js';
import { postgresJsDataLayer } from '../src/postgres-js/index.js';
import { prismaDataLayer } from '../src/prisma/index.js';
import {
  BullmqTickEnqueuer,
  Janitor,
  Maintenance,
  Scheduler,
  Sweeper,
  startHttpServerProcess,
  startMaintenanceProcess,
  startOutboxRelayProcess,
  startWorkerProcess,
} from '../src/process/index.js';
import { PostgresKeyStore } from '../src/store/index.js';
import { typeormDataLayer } from '../src/typeorm/index.js';

/** Stands in for a database handle, a key store or a client: never used, as the refusal comes first. */
const handle = {} as never;
const keys = { options: { leaseMs: 30_000 }, claim: () => undefined } as never;
const connection = { host: '127.0.0.1' };

/** Each public constructor or factory, called with one misspelt option, and the name it should suggest. */
const cases: ReadonlyArray<readonly [where: string, misspelt: string, meant: string, call: (options: Record<string, unknown>) => unknown]> = [
  ['new IdempotencyKeys(options)', 'leaseMS', 'leaseMs', (o) => new IdempotencyKeys({ db: handle, ...o } as never)],
  ['new IdempotencyKeys(options), in groupCommit', 'maxJob', 'maxJobs', (o) => new IdempotencyKeys({ db: handle, groupCommit: o } as never)],
  ['createIdempotentWorker(options)', 'concurency', 'concurrency', (o) => createIdempotentWorker({ queue: 'q', connection, keys, handler: () => 1, ...o } as never)],
  ['new IdempotentProducer(options)', 'defaultScop', 'defaultScope', (o) => new IdempotentProducer({ queue: 'q', connection, ...o } as never)],
  ['new OutboxRelay(options)', 'batchsize', 'batchSize', (o) => new OutboxRelay({ db: handle, connection, ...o } as never)],
  ['createHttpApi(options)', 'adminToken', 'adminTokens', (o) => createHttpApi({ keys, connection, queues: ['q'], ...o } as never)],
  ['new Schedules(options)', 'shema', 'schema', (o) => new Schedules({ db: handle, ...o } as never)],
  ['createPostgresDb(options)', 'maxConnection', 'maxConnections', (o) => createPostgresDb({ connectionString: 'postgres://x@127.0.0.1/x', ...o } as never)],
  ['migrate(db, options)', 'keyPartitions', 'keysPartitions', (o) => migrate(handle, o as never)],
  ['new KeyedJobRunner(options)', 'fastpath', 'fastPath', (o) => new KeyedJobRunner({ keys, ...o } as never)],
  ['new IdempotentRequests(options)', 'nameSpace', 'namespace', (o) => new IdempotentRequests({ keys, ...o } as never)],
  ['pgDataLayer(pool, options)', 'nme', 'name', (o) => pgDataLayer(handle, o)],
  ['postgresJsDataLayer(sql, options)', 'nme', 'name', (o) => postgresJsDataLayer(handle, o)],
  ['drizzleDataLayer(db, options)', 'nme', 'name', (o) => drizzleDataLayer(handle, o)],
  ['prismaDataLayer(prisma, options)', 'timeOutMs', 'timeoutMs', (o) => prismaDataLayer(handle, o)],
  ['typeormDataLayer(dataSource, options)', 'nme', 'name', (o) => typeormDataLayer(handle, o)],
  ['knexDataLayer(db, options)', 'nme', 'name', (o) => knexDataLayer(handle, o)],
  ['mikroOrmDataLayer(em, options)', 'nme', 'name', (o) => mikroOrmDataLayer(handle, o)],
  ['createAmqpConsumer(options)', 'deadLetterQeue', 'deadLetterQueue', (o) => createAmqpConsumer({ url: 'amqp://x', queue: 'q', keys, handler: () => 1, ...o } as never)],
  ['createIdempotentNatsConsumer(options)', 'prefech', 'prefetch', (o) => createIdempotentNatsConsumer({ stream: 's', consumer: 'c', keys, handler: () => 1, ...o } as never)],
  ['startTracingFromEnv(options)', 'servicename', 'serviceName', (o) => startTracingFromEnv(o as never)],
  ['startWorkerProcess(options)', 'handleSignal', 'handleSignals', (o) => startWorkerProcess(o as never)],
  ['startHttpServerProcess(options)', 'handleSignal', 'handleSignals', (o) => startHttpServerProcess(o as never)],
  ['startMaintenanceProcess(options)', 'handleSignal', 'handleSignals', (o) => startMaintenanceProcess(o as never)],
  ['startOutboxRelayProcess(options)', 'handleSignal', 'handleSignals', (o) => startOutboxRelayProcess(o as never)],
  ['new Janitor(options)', 'tombstonesMs', 'tombstoneMs', (o) => new Janitor({ db: handle, ...o } as never)],
  ['new Sweeper(options)', 'sweepAfterMS', 'sweepAfterMs', (o) => new Sweeper({ db: handle, ...o } as never)],
  ['new Maintenance(options)', 'janitorInterval', 'janitorIntervalMs', (o) => new Maintenance({ db: handle, ...o } as never)],
  ['new Scheduler(options)', 'intervalMS', 'intervalMs', (o) => new Scheduler({ db: handle, enqueuer: handle, ...o } as never)],
  ['new BullmqTickEnqueuer(options)', 'queueJobOption', 'queueJobOptions', (o) => new BullmqTickEnqueuer({ connection, ...o } as never)],
  ['new PostgresKeyStore(db, schema, options)', 'batchClaim', 'batchClaims', (o) => new PostgresKeyStore(handle, 'idempotent_jobs', o as never)],
];

/** What `call` threw, synchronously or as a rejected promise. */
async function refusal(call: () => unknown): Promise<unknown> {
  try {
    await call();
  } catch (error) {
    return error;
  }
  return undefined;
}

describe('a misspelt option name', () => {
  it.each(cases)('%s refuses "%s", suggesting "%s"', async (where, misspelt, meant, call) => {
    const error = await refusal(() => call({ [misspelt]: 1 }));
    expect(error).toBeInstanceOf(ValidationError);
    expect((error as ValidationError).code).toBe('INVALID_OPTIONS');
    expect((error as ValidationError).field).toBe(misspelt);
    expect((error as Error).message).toContain(`${where}: unknown option "${misspelt}". Did you mean "${meant}"?`);
    expect((error as Error).message).toMatch(/Known options: .*\.$/);
  });
});

describe('backend', () => {
  it.each([
    ['createIdempotentWorker(options)', () => createIdempotentWorker({ queue: 'q', connection, keys, handler: () => 1, backend: 'postgress' } as never)],
    ['new IdempotentProducer(options)', () => new IdempotentProducer({ queue: 'q', connection, backend: 'postgress' } as never)],
    ['new OutboxRelay(options)', () => new OutboxRelay({ db: handle, connection, backend: 'postgress' } as never)],
  ])('%s refuses a backend that names none, listing the valid ones', async (where, call) => {
    const error = await refusal(call);
    expect(error).toBeInstanceOf(ValidationError);
    expect((error as Error).message).toBe(`${where}: backend "postgress" is not one of "redis", "postgres". Did you mean "postgres"?`);
  });
});

describe('closestName', () => {
  it('finds a slip (case, a swap, a missing letter) and nothing for an unrelated name', () => {
    const known = ['leaseMs', 'concurrency', 'retentionMs', 'schema'];
    expect(closestName('leaseMS', known)).toBe('leaseMs');
    expect(closestName('concurency', known)).toBe('concurrency');
    expect(closestName('retnetionMs', known)).toBe('retentionMs');
    expect(closestName('colour', known)).toBeUndefined();
    expect(editDistance('ab', 'ba')).toBe(1);
    expect(editDistance('', 'abc')).toBe(3);
  });
});
