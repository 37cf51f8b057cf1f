import type { ConsumeArgs } from './consume-args.js';
import type { EnvConfig } from './env-config.js';
import { ConfigError } from '../errors.js';
import { startAmqpConsumerProcess } from './amqp-consumer-process.js';
import type { AmqpConsumerOptions } from '../amqp/amqp-consumer.js';
import type { AmqpIdentityOptions } from '../amqp/amqp-identity.js';

/** `idempotent-jobs consume --broker amqp …`: the consumer process until a signal stops it. */
export async function runAmqpConsumer(args: ConsumeArgs, handler: AmqpConsumerOptions['handler'], config: EnvConfig): Promise<void> {
  await startAmqpConsumerProcess({ config, handler, url: args.url, queue: args.queue, concurrency: args.concurrency, identity: identityOf(args) });
}

function identityOf(args: ConsumeArgs): AmqpIdentityOptions {
  const source = args.keyFrom ?? 'body';
  if (source === 'body') return { source };
  if (source !== 'header' && source !== 'message-id') throw new ConfigError(`--key-from ${source}: one of body, header, message-id.`);
  if (!args.scope) throw new ConfigError(`--key-from ${source} needs --scope: keys read from ${source === 'header' ? 'a header' : 'the message id'} carry no scope.`);
  return { source, scope: args.scope };
}
