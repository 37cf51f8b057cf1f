/**
 * A one-member etcd of the caller's own, the store Patroni keeps its leader lock and cluster
 * state in: client and peer ports spare on 127.0.0.1, its data in the given directory. Patroni
 * speaks etcd's v3 API to it (`etcd3:` in its configuration). Binary: `ETCD`, else `etcd` on PATH
 * (Debian's `etcd-server` package).
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Daemon, freePorts, waitUntil } from './daemon.js';
import { findSystemTool, missingToolLine } from './system-tools.js';

export class PrivateEtcd {
  readonly clientPort: number;
  readonly #daemon: Daemon;

  private constructor(clientPort: number, daemon: Daemon) {
    this.clientPort = clientPort;
    this.#daemon = daemon;
  }

  /** Starts a new one-member cluster in `dir` (created if missing) and waits until it is healthy. */
  static async start(dir: string): Promise<PrivateEtcd> {
    mkdirSync(dir, { recursive: true });
    const binary = findSystemTool('etcd');
    if (binary === undefined) throw new Error(`no etcd binary: ${missingToolLine('etcd')}`);
    const [clientPort, peerPort] = (await freePorts(2)) as [number, number];
    const client = `http://127.0.0.1:${clientPort}`;
    const peer = `http://127.0.0.1:${peerPort}`;
    const daemon = await Daemon.start({
      label: 'etcd',
      binary,
      args: [
        '--name', 'etcd1',
        '--data-dir', join(dir, 'data'),
        '--listen-client-urls', client, '--advertise-client-urls', client,
        '--listen-peer-urls', peer, '--initial-advertise-peer-urls', peer,
        '--initial-cluster', `etcd1=${peer}`, '--initial-cluster-state', 'new',
        '--logger', 'zap', '--log-outputs', 'stderr',
      ],
      logFile: join(dir, 'etcd.log'),
    });
    const etcd = new PrivateEtcd(clientPort, daemon);
    try {
      await Promise.race([waitUntil('etcd healthy', () => etcd.#healthy(), 30_000), daemon.exitedEarly()]);
      return etcd;
    } catch (error) {
      await daemon.kill();
      throw error;
    }
  }

  /** `127.0.0.1:<client port>`, as Patroni's `etcd3.hosts` takes it. */
  get host(): string {
    return `127.0.0.1:${this.clientPort}`;
  }

  get pid(): number | undefined {
    return this.#daemon.pid;
  }

  /** Kills it (SIGKILL). */
  async stop(): Promise<void> {
    await this.#daemon.kill();
  }

  async #healthy(): Promise<true | undefined> {
    const response = await fetch(`http://${this.host}/health`, { signal: AbortSignal.timeout(1_000) });
    const body = (await response.json()) as { health?: string };
    return body.health === 'true' ? true : undefined;
  }
}
