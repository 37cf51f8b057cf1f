/**
 * A TCP proxy between consumers and the broker, so a test can cut every connection at once
 * (what a network partition or a broker restart looks like to a client) without touching the
 * shared broker. It is the fault-injecting proxy (test/support/fault-proxy.ts) with no other
 * fault in use, on the first free port of a list.
 */
import { FaultProxy } from '../support/fault-proxy.js';

export interface TcpProxy {
  readonly port: number;
  /** Destroys every open connection, both sides; new ones are accepted again at once. */
  dropConnections(): number;
  close(): Promise<void>;
}

/** Listens on the first free port of `ports` (0: any free port) and forwards to `target`. */
export async function startTcpProxy(target: { host: string; port: number }, ports: readonly number[]): Promise<TcpProxy> {
  for (const port of ports) {
    const proxy = await FaultProxy.start({ target, port }).catch(() => undefined);
    if (proxy) {
      return {
        port: proxy.port,
        dropConnections: () => proxy.cutConnections(),
        close: () => proxy.close(),
      };
    }
  }
  throw new Error(`no free port for the TCP proxy among ${ports[0]}–${ports.at(-1)}`);
}
