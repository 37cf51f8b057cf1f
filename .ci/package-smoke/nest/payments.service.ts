// A NestJS application's provider as Nest's default tsconfig compiles it ("module": "commonjs",
// the package's types found by its "types" field and typesVersions): the imports become
// `require('idempotent-jobs')` calls, and the ES module package loads through Node's
// require of ES modules.
import { IdempotencyKeys, IdempotentProducer, createIdempotentWorker, createPostgresDb, migrate, type IdempotentWorker } from 'idempotent-jobs';
import type { StartTracingOptions } from 'idempotent-jobs/otel';

interface Charge {
  readonly cents: number;
}

export class PaymentsService {
  readonly #db = createPostgresDb({ connectionString: process.env.DATABASE_URL! });
  readonly #schema = process.env.SCHEMA!;
  readonly #connection = { url: process.env.REDIS_URL! };
  readonly #prefix = process.env.REDIS_PREFIX!;
  #worker: IdempotentWorker<Charge, { charged: number }> | undefined;

  async onModuleInit(): Promise<void> {
    await migrate(this.#db, { schema: this.#schema });
    const keys = new IdempotencyKeys({ db: this.#db, schema: this.#schema, leaseMs: 30_000 });
    this.#worker = createIdempotentWorker<Charge, { charged: number }>({
      queue: 'smoke-nest',
      connection: this.#connection,
      prefix: this.#prefix,
      keys,
      handler: async (ctx) => ctx.transaction(async () => ({ charged: ctx.data.cents })),
    });
  }

  async chargeOnce(key: string, cents: number): Promise<unknown> {
    const producer = new IdempotentProducer({ queue: 'smoke-nest', connection: this.#connection, prefix: this.#prefix });
    const done = new Promise((resolve) => this.#worker!.on('event', (event) => event.kind === 'completed' && resolve(event)));
    await producer.enqueue({ name: 'charge', scope: 'smoke', key, data: { cents } });
    const event = await done;
    await producer.close();
    return event;
  }

  async onModuleDestroy(): Promise<void> {
    await this.#worker?.close();
    await this.#db.destroy();
  }
}

const tracing: StartTracingOptions = { serviceName: 'payments' };

async function main(): Promise<void> {
  const service = new PaymentsService();
  await service.onModuleInit();
  console.log('completed', JSON.stringify(await service.chargeOnce('order-nest', 2500)), tracing.serviceName);
  await service.onModuleDestroy();
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
