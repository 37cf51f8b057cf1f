/**
 * A TCP proxy in front of a broker, one per chaos consumer process, so the suite can cut that
 * one consumer's connections (both directions destroyed at once, as a dropped network path
 * would) while the broker and the other consumers go on. Clients reconnect through it.
 */
import { createConnection, createServer, type Server, type Socket } from 'node:net';

export class TcpProxy {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  #port = 0;

  private constructor(targetPort: number) {
    this.#server = createServer((client) => {
      const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
      for (const socket of [client, upstream]) {
        this.#sockets.add(socket);
        socket.on('close', () => this.#sockets.delete(socket));
        socket.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream);
      upstream.pipe(client);
    });
  }

  /** Listens on a free port of the loopback interface, forwarding to `targetPort`. */
  static async start(targetPort: number): Promise<TcpProxy> {
    const proxy = new TcpProxy(targetPort);
    await new Promise<void>((resolve) => proxy.#server.listen(0, '127.0.0.1', resolve));
    proxy.#port = (proxy.#server.address() as { port: number }).port;
    return proxy;
  }

  get url(): string {
    return `127.0.0.1:${this.#port}`;
  }

  /** Destroys every connection through the proxy; returns how many there were. */
  cut(): number {
    const count = this.#sockets.size;
    for (const socket of this.#sockets) socket.destroy();
    return count;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
