/**
 * A fault-injecting TCP proxy: clients connect to it instead of Postgres or Redis, and a test
 * makes the link between them slow, lossy, partitioned or cut, without touching the server
 * (which may be the machine's shared one) or the client.
 *
 * It works on the byte stream, above TCP, so each fault is shown as an application sees it:
 * - latency: every chunk arrives `latencyMs` (± `jitterMs`) late, in order;
 * - loss: TCP retransmits a lost segment, so the application sees a stall, not a gap: with
 *   probability `lossRate` a chunk is held for `retransmitMs`, doubled for each further loss in
 *   a row (TCP's exponential back-off), and everything behind it waits (head-of-line blocking);
 * - partition: nothing passes either way, but no connection is closed (no FIN, no RST: the
 *   peers see silence, as behind a dead link); what was sent meanwhile arrives once it heals, as
 *   TCP delivers it when retransmissions get through. Connections opened meanwhile are accepted
 *   but reach the server only after the heal;
 * - cut: every connection is closed at once (what a restart of a middlebox or a reset looks like).
 *
 * Packet-level faults (netem) are not available on every kernel: this machine's lacks the
 * netem queueing discipline, so a userspace proxy is what runs everywhere.
 */
import { createConnection, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { seededRandom, type Random } from '../chaos/random.js';

/** The faults on the link, both directions alike. Each option left out is no fault. */
export interface LinkFaults {
  /** Added one-way delay of every chunk. @defaultValue `0` */
  readonly latencyMs?: number;
  /** Up to this much more delay, uniformly at random (order is kept). @defaultValue `0` */
  readonly jitterMs?: number;
  /** Probability in [0, 1] that a chunk is "lost" and waits for a retransmission. @defaultValue `0` */
  readonly lossRate?: number;
  /** The first retransmission's wait (Linux's minimum retransmission timeout). @defaultValue `200` */
  readonly retransmitMs?: number;
}

/** Options of {@link FaultProxy.start}. */
export interface FaultProxyOptions {
  readonly target: { readonly host: string; readonly port: number };
  /** The port to listen on (127.0.0.1). @defaultValue `0`: any free port */
  readonly port?: number;
  /** Seed of the jitter and loss draws, so a run can be repeated. @defaultValue `1` */
  readonly seed?: number;
}

/** Above this many bytes held for one direction, the sender is paused until they drain. */
const HIGH_WATER_BYTES = 1 << 20;

export class FaultProxy {
  readonly target: { readonly host: string; readonly port: number };
  readonly #server: Server;
  readonly #links = new Set<ProxiedConnection>();
  readonly #random: Random;
  #faults: Required<LinkFaults> = { latencyMs: 0, jitterMs: 0, lossRate: 0, retransmitMs: 200 };
  #partitioned = false;
  #accepted = 0;
  #port = 0;

  private constructor(target: FaultProxyOptions['target'], random: Random) {
    this.target = target;
    this.#random = random;
    this.#server = createServer((client) => this.#accept(client));
  }

  /** Listens on 127.0.0.1 and forwards every connection to `target`. */
  static async start(options: FaultProxyOptions): Promise<FaultProxy> {
    const proxy = new FaultProxy(options.target, seededRandom(options.seed ?? 1, 0x70));
    await new Promise<void>((resolve, reject) => {
      proxy.#server.once('error', reject);
      proxy.#server.listen(options.port ?? 0, '127.0.0.1', () => {
        proxy.#server.off('error', reject);
        proxy.#port = (proxy.#server.address() as AddressInfo).port;
        resolve();
      });
    });
    return proxy;
  }

  /** The port it listens on, 127.0.0.1. */
  get port(): number {
    return this.#port;
  }

  /** `url` (a `postgres://` or `redis://` URL) with the proxy's host and port. */
  url(url: string): string {
    const through = new URL(url);
    through.hostname = '127.0.0.1';
    through.port = String(this.port);
    return through.toString();
  }

  /** The faults now in force. */
  get faults(): Required<LinkFaults> {
    return this.#faults;
  }

  /** Replaces the faults; they apply to every chunk from now on, on open and new connections. */
  setFaults(faults: LinkFaults): void {
    this.#faults = { latencyMs: 0, jitterMs: 0, lossRate: 0, retransmitMs: 200, ...faults };
  }

  /** Whether the link is partitioned. */
  get partitioned(): boolean {
    return this.#partitioned;
  }

  /** Stops all traffic both ways without closing anything, until {@link heal}. */
  partition(): void {
    this.#partitioned = true;
  }

  /** Ends a partition: what was held is delivered (with the faults in force), held connections reach the server. */
  heal(): void {
    this.#partitioned = false;
    for (const link of this.#links) link.resume();
  }

  /** Ends every fault: no latency, no loss, no partition. */
  clear(): void {
    this.setFaults({});
    this.heal();
  }

  /** Closes every open connection at once, both sides; new ones are accepted as before. Returns how many. */
  cutConnections(): number {
    const count = this.#links.size;
    for (const link of this.#links) link.destroy();
    return count;
  }

  /** Connections open now. */
  get openConnections(): number {
    return this.#links.size;
  }

  /** Connections accepted since the start. */
  get acceptedConnections(): number {
    return this.#accepted;
  }

  /** Closes every connection and stops listening. */
  async close(): Promise<void> {
    this.cutConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  #accept(client: Socket): void {
    this.#accepted++;
    const link = new ProxiedConnection(client, this.target, {
      partitioned: () => this.#partitioned,
      delayOfNextChunk: (lossesInARow) => this.#delayOfNextChunk(lossesInARow),
      closed: () => this.#links.delete(link),
    });
    this.#links.add(link);
  }

  /** The delay of one chunk, and whether it was "lost" (so the next loss in a row waits twice as long). */
  #delayOfNextChunk(lossesInARow: number): { delayMs: number; lost: boolean } {
    const { latencyMs, jitterMs, lossRate, retransmitMs } = this.#faults;
    let delayMs = latencyMs + (jitterMs > 0 ? this.#random.next() * jitterMs : 0);
    const lost = lossRate > 0 && this.#random.next() < lossRate;
    if (lost) delayMs += retransmitMs * 2 ** Math.min(lossesInARow, 6);
    return { delayMs, lost };
  }
}

interface LinkControl {
  partitioned(): boolean;
  delayOfNextChunk(lossesInARow: number): { delayMs: number; lost: boolean };
  closed(): void;
}

/** One client connection and its connection to the server, with a delayed pipe each way. */
class ProxiedConnection {
  readonly #client: Socket;
  readonly #target: FaultProxyOptions['target'];
  readonly #control: LinkControl;
  #upstream: Socket | undefined;
  readonly #toServer: DelayedPipe;
  #toClient: DelayedPipe | undefined;
  #destroyed = false;

  constructor(client: Socket, target: FaultProxyOptions['target'], control: LinkControl) {
    this.#client = client;
    this.#target = target;
    this.#control = control;
    client.on('error', () => this.destroy());
    // A close after an error ends the link at once; a clean close (FIN) first lets the bytes
    // still held for the other side arrive (a server's last error message, say).
    client.on('close', (hadError) => hadError && this.destroy());
    this.#toServer = new DelayedPipe(client, control, () => this.destroy());
    // Accepted during a partition: the server is reached only once it heals.
    if (!control.partitioned()) this.#connectUpstream();
  }

  /** After a partition: connects a held connection, and lets held bytes flow. */
  resume(): void {
    if (this.#destroyed) return;
    if (!this.#upstream) this.#connectUpstream();
    this.#toServer.schedule();
    this.#toClient?.schedule();
  }

  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.#toServer.stop();
    this.#toClient?.stop();
    this.#client.destroy();
    this.#upstream?.destroy();
    this.#control.closed();
  }

  #connectUpstream(): void {
    const upstream = createConnection(this.#target);
    this.#upstream = upstream;
    upstream.on('error', () => this.destroy());
    upstream.on('close', (hadError) => hadError && this.destroy());
    upstream.once('connect', () => {
      this.#toServer.attach(upstream);
      this.#toClient = new DelayedPipe(upstream, this.#control, () => this.destroy());
      this.#toClient.attach(this.#client);
    });
  }
}

/**
 * One direction: chunks read from `source` are held until their release time (now + the
 * faults' delay, never before the chunk ahead of them), then written to the sink, in order.
 * With no fault and nothing held, a chunk is written at once.
 */
class DelayedPipe {
  readonly #source: Socket;
  readonly #control: LinkControl;
  readonly #held: Array<{ chunk: Buffer; releaseAt: number }> = [];
  #heldBytes = 0;
  #lastReleaseAt = 0;
  #lossesInARow = 0;
  #sink: Socket | undefined;
  #timer: NodeJS.Timeout | undefined;
  #sourceEnded = false;
  #waitingForDrain = false;
  readonly #onFlushedEnd: () => void;

  /** `onFlushedEnd`: the source ended and everything it sent has been written. */
  constructor(source: Socket, control: LinkControl, onFlushedEnd: () => void) {
    this.#source = source;
    this.#control = control;
    this.#onFlushedEnd = onFlushedEnd;
    source.on('data', (chunk: Buffer) => this.#receive(chunk));
    source.on('end', () => {
      this.#sourceEnded = true;
      this.schedule();
    });
  }

  /** Where the bytes go (known once the server connection is up). */
  attach(sink: Socket): void {
    this.#sink = sink;
    sink.on('drain', () => {
      this.#waitingForDrain = false;
      this.schedule();
    });
    this.schedule();
  }

  stop(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#held.length = 0;
  }

  /** Writes what is due, and sets a timer for the next chunk. */
  schedule(): void {
    if (this.#timer || !this.#sink || this.#waitingForDrain || this.#control.partitioned()) return;
    const now = Date.now();
    while (this.#held.length > 0 && this.#held[0]!.releaseAt <= now) {
      const { chunk } = this.#held.shift()!;
      this.#heldBytes -= chunk.length;
      if (!this.#sink.write(chunk)) {
        this.#waitingForDrain = true;
        break;
      }
    }
    if (this.#heldBytes < HIGH_WATER_BYTES && this.#source.isPaused()) this.#source.resume();
    if (this.#waitingForDrain) return;
    if (this.#held.length > 0) {
      this.#timer = setTimeout(() => {
        this.#timer = undefined;
        this.schedule();
      }, this.#held[0]!.releaseAt - now);
    } else if (this.#sourceEnded) {
      this.#sink.end(this.#onFlushedEnd);
    }
  }

  #receive(chunk: Buffer): void {
    const { delayMs, lost } = this.#control.delayOfNextChunk(this.#lossesInARow);
    this.#lossesInARow = lost ? this.#lossesInARow + 1 : 0;
    const releaseAt = Math.max(Date.now() + delayMs, this.#lastReleaseAt);
    this.#lastReleaseAt = releaseAt;
    this.#held.push({ chunk, releaseAt });
    this.#heldBytes += chunk.length;
    if (this.#heldBytes >= HIGH_WATER_BYTES) this.#source.pause();
    this.schedule();
  }
}
