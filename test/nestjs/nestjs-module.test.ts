// @module-tag redis
/**
 * `idempotent-jobs/nestjs` in real Nest application contexts (`NestFactory`), on this file's
 * Postgres schema and Redis prefix: processors written the Nest way run each key once (a
 * function host with a step and a TypeORM effect, a database-only host in the injected
 * DataSource), a service enqueues through its injected producer and in its own TypeORM
 * transaction (the outbox), workers start only after every module has initialised, `app.close()`
 * drains and releases the key of a job still running, the terminus health indicator says up and
 * down, and bad set-ups are refused with what to change. The files in this folder are compiled
 * with Nest's decorator settings (./tsconfig.json).
 */
import 'reflect-metadata';
import { Controller, Get, Inject, Injectable, Module, type INestApplicationContext, type OnApplicationBootstrap, type OnModuleInit } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { InjectQueue, Processor } from '@nestjs/bullmq';
import { HealthCheckService, TerminusModule } from '@nestjs/terminus';
import { TypeOrmModule } from '@nestjs/typeorm';
import type { Queue } from 'bullmq';
import { sql } from 'kysely';
import { pino } from 'pino';
import { DataSource, type EntityManager } from 'typeorm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobIdFor, kyselyIn, toWireJobData, type DataLayer, type DatabaseOnlyJobContext, type IdempotentProducer, type JobContext, type WorkerEvent } from 'idempotent-jobs';
import {
  DatabaseOnlyWorkerHost,
  IdempotentJobsHealthIndicator,
  IdempotentJobsModule,
  IdempotentProcessor,
  IdempotentWorkerHost,
  InjectDataLayer,
  InjectIdempotentProducer,
  getIdempotentProducerToken,
  type IdempotentJobsModuleOptions,
} from 'idempotent-jobs/nestjs';
import { typeormDataLayer } from 'idempotent-jobs/typeorm';
import { createTestEnv, type TestEnv } from '../support/test-env.js';

let env: TestEnv;
const apps: INestApplicationContext[] = [];
const silent = pino({ level: 'silent' });

beforeAll(async () => {
  env = await createTestEnv('nestjs-module');
  await sql`create table ${sql.id(env.schema, 'ledger')} (key text not null, cents int not null, charge text)`.execute(env.db);
  await sql`create table ${sql.id(env.schema, 'orders')} (id text primary key)`.execute(env.db);
});
afterAll(async () => {
  for (const app of apps) await app.close().catch(() => {});
  await env?.teardown();
});

/** The module options of this file: its schema, prefix, the given data layer. */
function jobsOptions(dataSource: DataSource, extra: Partial<IdempotentJobsModuleOptions> = {}): IdempotentJobsModuleOptions {
  return {
    database: { connectionString: env.databaseUrl, maxConnections: 4, preparedStatements: env.preparedStatements },
    keys: { schema: env.schema, leaseMs: 5_000 },
    dataLayer: typeormDataLayer(dataSource),
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    worker: { shutdownTimeoutMs: 500 },
    logger: silent,
    ...extra,
  };
}

/** TypeORM as a Nest application configures it, on this file's schema. */
function typeOrm() {
  return TypeOrmModule.forRoot({ type: 'postgres', url: env.databaseUrl, schema: env.schema, poolSize: 4, entities: [] });
}

/** The root module's imports: TypeORM, the jobs module built from the injected DataSource, the queues. */
function rootImports(queues: string[], extra: Partial<IdempotentJobsModuleOptions> = {}) {
  return [
    typeOrm(),
    IdempotentJobsModule.forRootAsync({ inject: [DataSource], useFactory: (dataSource: DataSource) => jobsOptions(dataSource, extra) }),
    IdempotentJobsModule.registerQueue(...queues.map((name) => ({ name }))),
  ];
}

async function start(module: new () => unknown): Promise<INestApplicationContext> {
  const app = await NestFactory.createApplicationContext(module, { logger: false, abortOnError: false });
  apps.push(app);
  return app;
}

async function ledgerRows(prefix: string): Promise<Array<{ key: string; cents: number; charge: string | null }>> {
  const { rows } = await sql<{ key: string; cents: number; charge: string | null }>`
    select key, cents, charge from ${sql.id(env.schema, 'ledger')} where key like ${prefix + '%'} order by key`.execute(env.db);
  return rows;
}

/** Resolves with the first `count` events of `kinds` the worker emits. */
function events(worker: { on(event: 'event', listener: (event: WorkerEvent) => void): unknown }, kinds: string[], count: number): Promise<WorkerEvent[]> {
  const seen: WorkerEvent[] = [];
  return new Promise((resolve) => {
    worker.on('event', (event) => {
      if (!kinds.includes(event.kind)) return;
      seen.push(event);
      if (seen.length === count) resolve(seen);
    });
  });
}

describe('processors written the Nest way', () => {
  it('a function host runs a key once (a step, then the ledger row in the injected TypeORM transaction); a second job of the key replays', async () => {
    let charges = 0;
    @Injectable()
    class Gateway {
      async charge(cents: number): Promise<{ id: string }> {
        charges++;
        return { id: `ch_${cents}` };
      }
    }

    @IdempotentProcessor('fn-payments', { concurrency: 2 })
    class PaymentsProcessor extends IdempotentWorkerHost<{ cents: number }, { chargeId: string }> {
      constructor(
        private readonly gateway: Gateway,
        @InjectDataLayer() private readonly orm: DataLayer<EntityManager>,
      ) {
        super();
      }

      async process(ctx: JobContext<{ cents: number }>) {
        const charge = await ctx.step('charge', () => this.gateway.charge(ctx.data.cents));
        return ctx.transaction(this.orm, async (manager) => {
          await manager.query(`insert into "${env.schema}".ledger (key, cents, charge) values ($1, $2, $3)`, [ctx.key, ctx.data.cents, charge.id]);
          return { chargeId: charge.id };
        });
      }
    }

    @Injectable()
    class Checkout {
      constructor(
        @InjectIdempotentProducer('fn-payments') readonly payments: IdempotentProducer,
        @InjectQueue('fn-payments') readonly queue: Queue,
      ) {}
    }

    @Module({ imports: rootImports(['fn-payments']), providers: [Gateway, PaymentsProcessor, Checkout] })
    class AppModule {}

    const app = await start(AppModule);
    const processor = app.get(PaymentsProcessor);
    const checkout = app.get(Checkout);
    const settled = events(processor.worker, ['completed', 'replayed'], 2);
    expect((await checkout.payments.enqueue({ name: 'charge', key: 'fn-order-1', data: { cents: 1200 } })).status).toBe('added');
    // The same key under another job id, as a producer outside the module would add it.
    await checkout.queue.add('charge', toWireJobData('default', 'fn-order-1', { cents: 1200 }), { jobId: 'fn-order-1-again' });
    const kinds = (await settled).map((event) => event.kind).sort();
    expect(kinds).toEqual(['completed', 'replayed']);
    expect(await ledgerRows('fn-order-')).toEqual([{ key: 'fn-order-1', cents: 1200, charge: 'ch_1200' }]);
    expect(charges).toBe(1);
    expect(await (await checkout.queue.getJob('fn-order-1-again'))?.returnvalue).toEqual({ chargeId: 'ch_1200' });
  });

  it('a database-only host writes in the injected DataSource: claim, row and result in one TypeORM transaction', async () => {
    @IdempotentProcessor('db-ledger')
    class LedgerProcessor extends DatabaseOnlyWorkerHost<{ cents: number }, { booked: number }, EntityManager> {
      async transaction(manager: EntityManager, ctx: DatabaseOnlyJobContext<{ cents: number }>) {
        // The data layer's own transaction object: TypeORM's EntityManager.
        expect(manager.queryRunner?.isTransactionActive).toBe(true);
        await manager.query(`insert into "${env.schema}".ledger (key, cents) values ($1, $2)`, [ctx.key, ctx.data.cents]);
        return { booked: ctx.data.cents };
      }
    }
    @Injectable()
    class Booking {
      constructor(@InjectQueue('db-ledger') readonly queue: Queue) {}
    }
    @Module({ imports: rootImports(['db-ledger']), providers: [LedgerProcessor, Booking] })
    class AppModule {}

    const app = await start(AppModule);
    const worker = app.get(LedgerProcessor).worker;
    const settled = events(worker, ['completed', 'replayed'], 3);
    const queue = app.get(Booking).queue;
    for (const [jobId, key] of [['a', 'db-1'], ['b', 'db-1'], ['c', 'db-2']] as const) await queue.add('book', toWireJobData('default', key, { cents: 300 }), { jobId });
    expect((await settled).map((event) => event.kind).sort()).toEqual(['completed', 'completed', 'replayed']);
    expect(await ledgerRows('db-')).toEqual([
      { key: 'db-1', cents: 300, charge: null },
      { key: 'db-2', cents: 300, charge: null },
    ]);
  });

  it("on the Postgres backend, a service's enqueue in its own TypeORM transaction adds the job itself in that transaction (no outbox)", async () => {
    const queueSchema = `${env.schema}_queue`;
    @IdempotentProcessor('pg-payments')
    class PgProcessor extends DatabaseOnlyWorkerHost<{ cents: number }, { booked: number }, EntityManager> {
      async transaction(manager: EntityManager, ctx: DatabaseOnlyJobContext<{ cents: number }>) {
        await manager.query(`insert into "${env.schema}".ledger (key, cents) values ($1, $2)`, [ctx.key, ctx.data.cents]);
        return { booked: ctx.data.cents };
      }
    }
    @Injectable()
    class Orders {
      constructor(
        private readonly dataSource: DataSource,
        @InjectDataLayer() private readonly orm: DataLayer<EntityManager>,
        @InjectIdempotentProducer('pg-payments') readonly payments: IdempotentProducer,
      ) {}

      async place(id: string, fail: boolean): Promise<void> {
        await this.dataSource.transaction(async (manager) => {
          await manager.query(`insert into "${env.schema}".orders (id) values ($1)`, [id]);
          const { status } = await this.payments.enqueue({ name: 'charge', key: `pg-${id}`, data: { cents: 800 } }, { tx: kyselyIn(this.orm, manager) });
          expect(status).toBe('added');
          if (fail) throw new Error('card declined');
        });
      }
    }
    @Module({
      imports: [
        typeOrm(),
        IdempotentJobsModule.forRootAsync({ inject: [DataSource], useFactory: (dataSource: DataSource) => jobsOptions(dataSource) }),
        IdempotentJobsModule.registerQueue({ name: 'pg-payments', backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema }),
      ],
      providers: [PgProcessor, Orders],
    })
    class AppModule {}

    const app = await start(AppModule);
    const completed = events(app.get(PgProcessor).worker, ['completed'], 1);
    await expect(app.get(Orders).place('p-2', true)).rejects.toThrow('card declined');
    await app.get(Orders).place('p-1', false);
    expect((await completed)[0]!.key).toBe('pg-p-1');
    expect(await ledgerRows('pg-')).toEqual([{ key: 'pg-p-1', cents: 800, charge: null }]);
    const queue = app.get<IdempotentProducer>(getIdempotentProducerToken('pg-payments')).queue;
    expect(await queue.getJob(jobIdFor('default', 'pg-p-2'))).toBeUndefined();
  });

  it("a service enqueues in its own TypeORM transaction (the outbox): the job exists if and only if the service's rows commit", async () => {
    @IdempotentProcessor('outbox-payments')
    class PaymentsProcessor extends IdempotentWorkerHost<{ cents: number }, { ok: true }> {
      async process(ctx: JobContext<{ cents: number }>) {
        return ctx.transaction(async (tx) => {
          await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, cents: ctx.data.cents }).execute();
          return { ok: true as const };
        });
      }
    }
    @Injectable()
    class Orders {
      constructor(
        private readonly dataSource: DataSource,
        @InjectDataLayer() private readonly orm: DataLayer<EntityManager>,
        @InjectIdempotentProducer('outbox-payments') private readonly payments: IdempotentProducer,
      ) {}

      async place(id: string, fail: boolean): Promise<void> {
        await this.dataSource.transaction(async (manager) => {
          await manager.query(`insert into "${env.schema}".orders (id) values ($1)`, [id]);
          await this.payments.enqueue({ name: 'charge', key: `outbox-${id}`, data: { cents: 700 } }, { tx: kyselyIn(this.orm, manager) });
          if (fail) throw new Error('card declined');
        });
      }
    }
    @Module({ imports: rootImports(['outbox-payments']), providers: [PaymentsProcessor, Orders] })
    class AppModule {}

    const app = await start(AppModule);
    const completed = events(app.get(PaymentsProcessor).worker, ['completed'], 1);
    await expect(app.get(Orders).place('o-2', true)).rejects.toThrow('card declined');
    await app.get(Orders).place('o-1', false);
    expect((await completed)[0]!.key).toBe('outbox-o-1');
    expect(await ledgerRows('outbox-')).toEqual([{ key: 'outbox-o-1', cents: 700, charge: null }]);
    const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(env.schema, 'outbox')} where job_id like '%outbox-o-2%'`.execute(env.db);
    expect(rows[0]!.n).toBe(0);
  });
});

describe("Nest's lifecycle", () => {
  it("workers start once every module has initialised; app.close() lets a running job go after shutdownTimeoutMs and releases its key, which the next instance completes", async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let runs = 0;
    const signals: boolean[] = [];

    @IdempotentProcessor('slow-payments')
    class SlowProcessor extends IdempotentWorkerHost<{ cents: number }, { runs: number }> {
      async process(ctx: JobContext<{ cents: number }>) {
        const run = ++runs;
        if (run === 1) {
          await Promise.race([gate, new Promise((resolve) => ctx.signal.addEventListener('abort', resolve))]);
          signals.push(ctx.signal.aborted);
          throw new Error('stopped by the shutdown');
        }
        return ctx.transaction(async (tx) => {
          await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, cents: ctx.data.cents }).execute();
          return { runs: run };
        });
      }
    }
    const seenAtInit: string[] = [];
    @Injectable()
    class Watcher implements OnModuleInit, OnApplicationBootstrap {
      constructor(
        @Inject(SlowProcessor) private readonly processor: SlowProcessor,
        @InjectIdempotentProducer('slow-payments') readonly payments: IdempotentProducer,
      ) {}
      onModuleInit() {
        try {
          void this.processor.worker;
          seenAtInit.push('running');
        } catch (error) {
          seenAtInit.push((error as Error).message);
        }
      }
      onApplicationBootstrap() {
        // Bootstrap hooks run in module order: the worker may or may not be up yet here.
      }
    }
    @Module({ imports: rootImports(['slow-payments']), providers: [SlowProcessor, Watcher] })
    class AppModule {}

    const first = await start(AppModule);
    expect(seenAtInit).toEqual([expect.stringMatching(/SlowProcessor's worker has not started yet: .*onApplicationBootstrap/)]);
    const claimed = events(first.get(SlowProcessor).worker, ['claimed'], 1);
    await first.get(Watcher).payments.enqueue({ name: 'charge', key: 'slow-1', data: { cents: 900 } });
    await claimed;
    await first.close();
    expect(signals).toEqual([true]);
    const record = await sql<{ status: string; owner: string | null }>`select status, owner from ${sql.id(env.schema, 'idempotency_keys')} where key = 'slow-1'`.execute(env.db);
    expect(record.rows).toEqual([{ status: 'processing', owner: null }]);

    const second = await start(AppModule);
    const completed = events(second.get(SlowProcessor).worker, ['completed'], 1);
    expect((await completed)[0]!.key).toBe('slow-1');
    release();
    expect(await ledgerRows('slow-')).toEqual([{ key: 'slow-1', cents: 900, charge: null }]);
    await second.close();
  });

  it('the terminus health indicator is up while the workers run, and down, naming the worker, once one is closed', async () => {
    @IdempotentProcessor('health-payments')
    class HealthProcessor extends IdempotentWorkerHost {
      async process() {
        return null;
      }
    }
    @Controller('health')
    class HealthController {
      constructor(
        readonly health: HealthCheckService,
        readonly jobs: IdempotentJobsHealthIndicator,
      ) {}
      @Get()
      check() {
        return this.health.check([() => this.jobs.isHealthy('jobs')]);
      }
    }
    @Module({
      imports: [...rootImports(['health-payments'], { listenerConnectionString: env.databaseDirectUrl }), TerminusModule.forRoot({ logger: false })],
      providers: [HealthProcessor],
      controllers: [HealthController],
    })
    class AppModule {}

    const app = await start(AppModule);
    const controller = app.get(HealthController);
    const up = await controller.check();
    expect(up.status).toBe('ok');
    expect(up.details.jobs).toEqual({ status: 'up', store: 'writable', listener: 'connected', workers: { 'health-payments': 'running' }, relay: 'running' });
    await app.get(HealthProcessor).worker.close();
    const down = await controller.check().catch((error: { getResponse(): { status: string; details: Record<string, unknown> } }) => error.getResponse());
    expect(down.status).toBe('error');
    expect(down.details.jobs).toMatchObject({ status: 'down', store: 'writable', workers: { 'health-payments': 'not running (closing or closed)' } });
  });
});

describe('set-ups the module refuses, saying what to change', () => {
  it('options it does not know, or without the database', () => {
    expect(() => IdempotentJobsModule.forRoot({ connection: {}, database: 'postgres://x', concurency: 4 } as never)).toThrow(
      /IdempotentJobsModule\.forRoot: unknown option "concurency"\. Known options: /,
    );
    expect(() => IdempotentJobsModule.forRoot({ connection: {} } as never)).toThrow(/needs the keys' database: give `database` .* or `db` .*, not neither/);
    expect(() => IdempotentJobsModule.registerQueue({ name: 'q', defaultJobOpts: {} } as never)).toThrow(/registerQueue: unknown option "defaultJobOpts"\. Did you mean "defaultJobOptions"\?/);
    expect(() => IdempotentProcessor('q', { concurency: 2 } as never)).toThrow(/@IdempotentProcessor\('q'\): unknown option "concurency"\. Did you mean "concurrency"\?/);
    expect(() => IdempotentJobsModule.forRootAsync({ useFactory: () => ({}) as never, inejct: [] } as never)).toThrow(/forRootAsync: unknown option "inejct"\. Did you mean "inject"\?/);
  });

  it("a host class under @nestjs/bullmq's @Processor, and a processor extending neither host, fail the bootstrap", async () => {
    @Processor('wrong-decorator')
    class WrongDecorator extends IdempotentWorkerHost {
      async process() {
        return null;
      }
    }
    @Module({ imports: rootImports([]), providers: [WrongDecorator] })
    class WrongDecoratorModule {}
    await expect(start(WrongDecoratorModule)).rejects.toThrow(/WrongDecorator extends IdempotentWorkerHost but is decorated with @nestjs\/bullmq's @Processor.*@IdempotentProcessor from 'idempotent-jobs\/nestjs'/);

    @IdempotentProcessor('no-host')
    class NoHost {
      async process() {
        return null;
      }
    }
    @Module({ imports: rootImports([]), providers: [NoHost] })
    class NoHostModule {}
    await expect(start(NoHostModule)).rejects.toThrow(/NoHost is decorated with @IdempotentProcessor\('no-host'\) but extends neither IdempotentWorkerHost/);
  });
});
