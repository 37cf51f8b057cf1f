/**
 * An HAProxy of the caller's own in TCP mode, as it stands in front of a Patroni cluster: each
 * listener forwards to the one server whose HTTP health check answers 200 (Patroni's REST API:
 * `/primary` answers 200 on the leader only, `/replica` on a running standby only). A server
 * that stops answering 200 is marked down after two checks and its sessions are cut
 * (`on-marked-down shutdown-sessions`), so clients reconnect and land on the new leader, as
 * they do behind a production HAProxy. Binary: `HAPROXY`, else `haproxy` on PATH, else
 * `/usr/sbin/haproxy` (Debian's `haproxy` package).
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Daemon, freePorts, waitForPort } from './daemon.js';
import { findSystemTool, missingToolLine } from './system-tools.js';

/** One backend server: where clients go, and where its health check asks. */
export interface HaProxyServer {
  readonly name: string;
  readonly port: number;
  readonly checkPort: number;
}

/** One listener: a spare port that forwards to whichever `servers` pass `checkPath`. */
export interface HaProxyListener {
  readonly name: string;
  /** The HTTP path checked on each server's `checkPort` (Patroni: `/primary`, `/replica`). */
  readonly checkPath: string;
  readonly servers: readonly HaProxyServer[];
}

/** Options of {@link HaProxy.start}. */
export interface HaProxyOptions {
  readonly dir: string;
  readonly listeners: readonly HaProxyListener[];
  /** Time between health checks of a server. @defaultValue `250` */
  readonly checkIntervalMs?: number;
}

export class HaProxy {
  /** Listener name → its port on 127.0.0.1. */
  readonly ports: ReadonlyMap<string, number>;
  readonly #daemon: Daemon;

  private constructor(ports: Map<string, number>, daemon: Daemon) {
    this.ports = ports;
    this.#daemon = daemon;
  }

  /** Writes `haproxy.cfg` into `options.dir`, starts HAProxy, and waits until every listener accepts connections. */
  static async start(options: HaProxyOptions): Promise<HaProxy> {
    const binary = findSystemTool('haproxy');
    if (binary === undefined) throw new Error(`no haproxy binary: ${missingToolLine('haproxy')}`);
    const listenPorts = await freePorts(options.listeners.length);
    const ports = new Map(options.listeners.map((listener, i) => [listener.name, listenPorts[i]!]));
    const config = join(options.dir, 'haproxy.cfg');
    writeFileSync(config, haProxyConfig(options, ports));
    // -db: stay in the foreground, no daemon; its log lines go to stderr.
    const daemon = await Daemon.start({ label: 'haproxy', binary, args: ['-f', config, '-db'], logFile: join(options.dir, 'haproxy.log') });
    try {
      await Promise.race([Promise.all(listenPorts.map((port) => waitForPort(port, 15_000, 'haproxy'))), daemon.exitedEarly()]);
      return new HaProxy(ports, daemon);
    } catch (error) {
      await daemon.kill();
      throw error;
    }
  }

  port(listener: string): number {
    const port = this.ports.get(listener);
    if (port === undefined) throw new Error(`haproxy has no listener "${listener}"`);
    return port;
  }

  get pid(): number | undefined {
    return this.#daemon.pid;
  }

  logTail(chars?: number): string {
    return this.#daemon.logTail(chars);
  }

  async stop(): Promise<void> {
    await this.#daemon.kill();
  }
}

/** The configuration of an {@link HaProxy}. */
export function haProxyConfig(options: HaProxyOptions, ports: ReadonlyMap<string, number>): string {
  const interval = options.checkIntervalMs ?? 250;
  const lines = [
    'global',
    '  maxconn 1000',
    'defaults',
    '  mode tcp',
    '  timeout connect 2s',
    // Idle database sessions (a pool's, a LISTEN) must not be cut by the proxy.
    '  timeout client 1h',
    '  timeout server 1h',
    '  timeout check 1s',
  ];
  for (const listener of options.listeners) {
    lines.push(
      `listen ${listener.name}`,
      `  bind 127.0.0.1:${ports.get(listener.name)}`,
      // OPTIONS, not GET: Patroni answers it without a body, so HAProxy closing the check
      // connection early does not make Patroni log a ConnectionResetError at every check.
      `  option httpchk OPTIONS ${listener.checkPath}`,
      '  http-check expect status 200',
      `  default-server inter ${interval}ms fastinter ${interval}ms downinter ${interval}ms fall 2 rise 1 on-marked-down shutdown-sessions`,
      ...listener.servers.map((server) => `  server ${server.name} 127.0.0.1:${server.port} check port ${server.checkPort}`),
    );
  }
  return `${lines.join('\n')}\n`;
}
