import type { KeyedJobHandler } from '../consumer/database-only-handler.js';
import { ConfigError } from '../errors.js';
import { loadEnvConfig, type EnvConfig } from './env-config.js';
import type { ConsumeArgs } from './consume-args.js';
import { loadHandlerModule } from './handler-module.js';

/** Starts one broker's consumer with a loaded handler; each broker adds one entry. */
type BrokerConsumer = (args: ConsumeArgs, handler: KeyedJobHandler<unknown, unknown, any>, config: EnvConfig) => Promise<unknown>;

// Loaded on demand: each broker's client is an optional peer dependency, needed only when chosen.
const BROKERS: Record<string, () => Promise<BrokerConsumer>> = {
  amqp: async () => (await import('./amqp-command.js')).runAmqpConsumer,
  nats: async () => (await import('./nats-command.js')).runNatsConsumer,
};

/** The brokers `consume --broker` accepts. */
export const CONSUME_BROKERS: readonly string[] = Object.keys(BROKERS);

/**
 * `idempotent-jobs consume`: the chosen broker's consumer process with the handler module,
 * configured from the environment, until a signal stops it. An unknown broker is a
 * `ConfigError` naming the known ones.
 */
export async function runConsumer(args: ConsumeArgs): Promise<void> {
  const load = BROKERS[args.broker];
  if (!load) throw new ConfigError(`--broker ${args.broker}: unknown broker; one of ${CONSUME_BROKERS.join(', ')}.`);
  const config = loadEnvConfig(process.env);
  const handler = await loadHandlerModule(args.handler);
  await (await load())(args, handler, config);
}
