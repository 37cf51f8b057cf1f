/**
 * The test files that need a message broker: RabbitMQ (`// @module-tag rabbitmq`) or NATS with
 * JetStream (`// @module-tag nats`), file tags that vitest.config.ts defines. The brokers are
 * optional integrations, so a broker that does not answer at its URL (`AMQP_URL`, `NATS_URL`, or
 * the local default) makes a run without it: outside CI the files marked for it are skipped and
 * the set-up says so in one line; with `CI=true` each of them fails at its start with that line
 * (./redis-guard.ts), so that CI never passes by skipping.
 */
import { connect } from 'node:net';
import { inCi } from './system-tools.js';

/** Each broker a test file can need, by the name of its file tag. */
export const BROKERS = {
  rabbitmq: {
    title: 'RabbitMQ',
    variable: 'AMQP_URL',
    url: (env: NodeJS.ProcessEnv) => env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672',
    defaultPort: 5672,
    install: 'apt-get install rabbitmq-server',
  },
  nats: {
    title: 'NATS with JetStream',
    variable: 'NATS_URL',
    url: (env: NodeJS.ProcessEnv) => env.NATS_URL || '127.0.0.1:4222',
    defaultPort: 4222,
    install: 'apt-get install nats-server, started with -js',
  },
} as const;

export type BrokerTag = keyof typeof BROKERS;

export const BROKER_TAGS = Object.keys(BROKERS) as BrokerTag[];

/** Host and port of a broker URL (`amqp://user:pass@host:port/vhost` or NATS's `host:port`). */
export function brokerAddress(tag: BrokerTag, env: NodeJS.ProcessEnv = process.env): { host: string; port: number } {
  const broker = BROKERS[tag];
  const raw = broker.url(env);
  const url = new URL(raw.includes('://') ? raw : `nats://${raw}`);
  return { host: url.hostname || '127.0.0.1', port: url.port ? Number(url.port) : broker.defaultPort };
}

/** Why the broker does not answer (a TCP connection to its address failed), or undefined when it does. */
export function brokerAbsence(tag: BrokerTag, env: NodeJS.ProcessEnv = process.env, timeoutMs = 2_000): Promise<string | undefined> {
  const { host, port } = brokerAddress(tag, env);
  return new Promise((resolve) => {
    const socket = connect(port, host);
    const done = (problem: string | undefined) => {
      socket.destroy();
      resolve(problem);
    };
    socket.setTimeout(timeoutMs, () => done(`nothing answered at ${host}:${port} within ${timeoutMs} ms`));
    socket.once('connect', () => done(undefined));
    socket.once('error', (error: NodeJS.ErrnoException) => done(`${host}:${port}: ${error.code ?? error.message}`));
  });
}

/**
 * The one line that says the files that need a broker are skipped (or, under CI, fail), why, and
 * what to do. `file`: one file's name, for its own failure; else the line is about them all.
 */
export function missingBrokerLine(tag: BrokerTag, problem: string, file?: string, env: NodeJS.ProcessEnv = process.env): string {
  const broker = BROKERS[tag];
  const which = file ?? `the tests tagged \`${tag}\` (files marked \`@module-tag ${tag}\`, and single tests)`;
  const outcome = inCi(env) ? (file ? 'fails under CI=true' : 'fail under CI=true') : 'skipped';
  return `${which} ${outcome}: ${broker.title} did not answer (${problem}); install it with \`${broker.install}\`, or set ${broker.variable} to one that answers.`;
}
