/**
 * Per-test-file JetStream isolation: streams named for the file (a random suffix), deleted at
 * teardown with nothing else touched. The shared server is `NATS_URL` (default 127.0.0.1:4222).
 */
import { randomBytes } from 'node:crypto';
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection } from '@nats-io/transport-node';

export interface NatsTestEnv {
  readonly servers: string;
  readonly connection: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  /** A new stream name (and subject prefix) of this file's own; streams named with it as a prefix are deleted at teardown. */
  name(what: string): string;
  teardown(): Promise<void>;
}

export const sharedNatsUrl = (): string => process.env.NATS_URL ?? '127.0.0.1:4222';

export async function createNatsTestEnv(file: string, servers: string = sharedNatsUrl()): Promise<NatsTestEnv> {
  const suffix = randomBytes(4).toString('hex');
  const connection = await connect({ servers });
  const jsm = await jetstreamManager(connection);
  // Every stream whose name starts with this is the file's own (dead-letter streams named after theirs included).
  const prefix = `ijtest_${file}_${suffix}_`;
  let count = 0;
  return {
    servers,
    connection,
    js: jetstream(connection),
    jsm,
    name(what) {
      return `${prefix}${what}${++count}`.replace(/[^A-Za-z0-9_-]/g, '_');
    },
    async teardown() {
      for await (const name of jsm.streams.names()) {
        if (name.startsWith(prefix)) await jsm.streams.delete(name).catch(() => false);
      }
      await connection.close();
    },
  };
}
