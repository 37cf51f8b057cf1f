import type { Command } from 'commander';
import { loadEnvConfig, type EnvConfig } from '../config/env-config.js';
import type { KeyedJobHandler } from '../consumer/database-only-handler.js';
import { ConfigError } from '../errors.js';
import { loadHandlerModule } from '../runtime/handler-module.js';

/** What `consume` was given, for every broker. */
export interface ConsumeArgs {
  readonly broker: string;
  readonly handler: string;
  /** Queue (AMQP) or stream/consumer (JetStream). */
  readonly queue?: string;
  readonly url?: string;
  readonly concurrency?: number;
  /** Where the key comes from: `body` (wire contract), `header`, `message-id`. */
  readonly keyFrom?: string;
  /** The scope of keys read from headers. */
  readonly scope?: string;
}

/** Starts one broker's consumer with a loaded handler; each broker adds one entry. */
type BrokerConsumer = (args: ConsumeArgs, handler: KeyedJobHandler<unknown, unknown, any>, config: EnvConfig) => Promise<unknown>;

const BROKERS: Record<string, () => Promise<BrokerConsumer>> = {
  amqp: async () => (await import('../amqp/amqp-command.js')).runAmqpConsumer,
  nats: async () => (await import('../nats/nats-command.js')).runNatsConsumer,
};

/** `consume --broker amqp|nats --handler <module> [--queue q] [--url u] [--concurrency N] [--key-from body|header|message-id --scope s]`. */
export function registerConsumeCommand(program: Command): void {
  program
    .command('consume')
    .description('consume a broker queue with your handler module (its default export: async (ctx) => result, or { transaction: async (tx, ctx) => result }), once per idempotency key')
    .requiredOption('--broker <name>', `the broker: ${Object.keys(BROKERS).join(' | ')}`)
    .requiredOption('--handler <module>', 'path to the handler module')
    .option('--queue <name>', 'queue to consume (default: $QUEUE or "payments"); NATS: <stream>/<durable consumer>')
    .option('--url <url>', 'broker URL (default: $AMQP_URL or amqp://guest:guest@127.0.0.1:5672; NATS: $NATS_URL or 127.0.0.1:4222)')
    .option('--concurrency <n>', 'messages at once (default: $CONCURRENCY or 8)', (v) => Number.parseInt(v, 10))
    .option('--key-from <source>', 'where the idempotency key is: body (wire contract), header, message-id', 'body')
    .option('--scope <scope>', 'scope of keys read from a header or the message id')
    .action(async (args: ConsumeArgs) => {
      const load = BROKERS[args.broker];
      if (!load) throw new ConfigError(`--broker ${args.broker}: unknown broker; one of ${Object.keys(BROKERS).join(', ')}.`);
      const config = loadEnvConfig(process.env);
      const handler = await loadHandlerModule(args.handler);
      await (await load())(args, handler, config);
    });
}
