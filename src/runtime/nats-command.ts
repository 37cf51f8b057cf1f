import type { ConsumeArgs } from './consume-args.js';
import type { EnvConfig } from './env-config.js';
import { ConfigError } from '../errors.js';
import { startNatsConsumerProcess } from './nats-consumer-process.js';
import type { IdempotentNatsConsumerOptions } from '../nats/idempotent-nats-consumer.js';
import type { NatsKeySource } from '../nats/nats-message-identity.js';

/**
 * `idempotent-jobs consume --broker nats --queue STREAM/consumer …`: the consumer process until a
 * signal stops it. `--queue` names the stream (which must exist) and the durable consumer (created
 * when missing); `--url` the NATS servers (default `$NATS_URL` or `127.0.0.1:4222`); `--key-from`
 * `body` (the wire contract) or `header` / `message-id` (both: the `Nats-Msg-Id` header).
 */
export async function runNatsConsumer(args: ConsumeArgs, handler: IdempotentNatsConsumerOptions['handler'], config: EnvConfig): Promise<void> {
  const { stream, consumer } = streamAndConsumer(args.queue ?? process.env.QUEUE);
  await startNatsConsumerProcess({
    config,
    handler,
    servers: args.url,
    stream,
    consumer,
    concurrency: args.concurrency,
    ...keySource(args),
  });
}

function streamAndConsumer(queue: string | undefined): { stream: string; consumer: string } {
  const match = /^([^/.\s*>]+)\/([^/.\s*>]+)$/.exec(queue ?? '');
  if (!match) throw new ConfigError(`--queue ${queue ?? '(unset)'}: for NATS, give <stream>/<durable consumer>, e.g. ORDERS/payments.`);
  return { stream: match[1]!, consumer: match[2]! };
}

function keySource(args: ConsumeArgs): { keyFrom: NatsKeySource; scope?: string } {
  const source = args.keyFrom ?? 'body';
  if (source === 'body') return { keyFrom: 'wire-contract' };
  if (source !== 'header' && source !== 'message-id') throw new ConfigError(`--key-from ${source}: one of body, header, message-id (both read Nats-Msg-Id on NATS).`);
  if (!args.scope) throw new ConfigError(`--key-from ${source} needs --scope: keys read from Nats-Msg-Id carry no scope.`);
  return { keyFrom: 'nats-msg-id', scope: args.scope };
}
