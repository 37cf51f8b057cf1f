import type { Command } from 'commander';
import type { ConsumeArgs } from '../runtime/consume-args.js';
import { CONSUME_BROKERS, runConsumer } from '../runtime/consume.js';

/** `consume --broker amqp|nats --handler <module> [--queue q] [--url u] [--concurrency N] [--key-from body|header|message-id --scope s]`. */
export function registerConsumeCommand(program: Command): void {
  program
    .command('consume')
    .description('consume a broker queue with your handler module (its default export: async (ctx) => result, or { transaction: async (tx, ctx) => result }), once per idempotency key')
    .requiredOption('--broker <name>', `the broker: ${CONSUME_BROKERS.join(' | ')}`)
    .requiredOption('--handler <module>', 'path to the handler module')
    .option('--queue <name>', 'queue to consume (default: $QUEUE or "payments"); NATS: <stream>/<durable consumer>')
    .option('--url <url>', 'broker URL (default: $AMQP_URL or amqp://guest:guest@127.0.0.1:5672; NATS: $NATS_URL or 127.0.0.1:4222)')
    .option('--concurrency <n>', 'messages at once (default: $CONCURRENCY or 8)', (v) => Number.parseInt(v, 10))
    .option('--key-from <source>', 'where the idempotency key is: body (wire contract), header, message-id', 'body')
    .option('--scope <scope>', 'scope of keys read from a header or the message id')
    .action((args: ConsumeArgs) => runConsumer(args));
}
