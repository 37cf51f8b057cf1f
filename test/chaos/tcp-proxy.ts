/**
 * A TCP proxy between consumers and the broker, so a test can cut every connection at once
 * (what a network partition or a broker restart looks like to a client) without touching the
 * shared broker.
 */
import { createConnection, createServer, type AddressInfo, type Server, type Socket } from 'node:net';

export interface TcpProxy {
  readonly port: number;
  /** Destroys every open connection, both sides; new ones are accepted again at once. */
  dropConnections(): number;
  close(): Promise<void>;
}

/** Listens on the first free port of `ports` (0: any free port) and forwards to `target`. */
export async function startTcpProxy(target: { host: string; port: number }, ports: readonly number[]): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = createConnection(target);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {});
    }
    client.pipe(upstream).pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  for (const port of ports) {
    const bound = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (bound) {
      return {
        port: (server.address() as AddressInfo).port,
        dropConnections() {
          const count = sockets.size / 2;
          for (const socket of sockets) socket.destroy();
          return count;
        },
        close: () =>
          new Promise<void>((resolve) => {
            for (const socket of sockets) socket.destroy();
            server.close(() => resolve());
          }),
      };
    }
  }
  throw new Error(`no free port for the TCP proxy among ${ports[0]}–${ports.at(-1)}`);
}
