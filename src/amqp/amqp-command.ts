import type { ConsumeMessage } from 'amqplib';
import type { ConsumeArgs } from '../cli/consume-command.js';
import type { KeyedJobHandler } from '../consumer/database-only-handler.js';
import type { EnvConfig } from '../config/env-config.js';
import { ConfigError } from '../errors.js';
import { startAmqpConsumerProcess } from './amqp-consumer-process.js';
import type { AmqpIdentityOptions } from './amqp-identity.js';

/** `idempotent-jobs consume --broker amqp …`: the consumer process until a signal stops it. */
export async function runAmqpConsumer(args: ConsumeArgs, handler: KeyedJobHandler<unknown, unknown, ConsumeMessage>, config: EnvConfig): Promise<void> {
  await startAmqpConsumerProcess({ config, handler, url: args.url, queue: args.queue, concurrency: args.concurrency, identity: identityOf(args) });
}

function identityOf(args: ConsumeArgs): AmqpIdentityOptions {
  const source = args.keyFrom ?? 'body';
  if (source === 'body') return { source };
  if (source !== 'header' && source !== 'message-id') throw new ConfigError(`--key-from ${source}: one of body, header, message-id.`);
  if (!args.scope) throw new ConfigError(`--key-from ${source} needs --scope: keys read from ${source === 'header' ? 'a header' : 'the message id'} carry no scope.`);
  return { source, scope: args.scope };
}
