import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { concurrencySlotFreedChannel, keySettledChannel } from './channels.js';

type Waiter = () => void;

/** A slot of a concurrency key was freed, and this is the oldest job waiting for one (see `sql/concurrency-slot-wakes.ts`). */
export interface FreedSlot {
  /** The concurrency key. */
  readonly group: string;
  /** The queue of the waiting job. */
  readonly queue: string;
  /** The broker's id of the waiting job. */
  readonly jobId: string;
}

/** First and longest pause between two looks at a waited-for key that sent no notification. */
const FIRST_LOOK_AFTER_MS = 50;
const MAX_LOOK_INTERVAL_MS = 250;

/**
 * One dedicated connection per process that LISTENs for keys becoming completed or failed, so
 * a duplicate can wait for the owner to finish without busy polling.
 *
 * A key notifies only when someone asked: NOTIFY takes a database-wide lock at commit, which
 * halved commit throughput when every completion notified. So a waiter, once subscribed, sets
 * the key's `has_waiters` flag (only on a `processing` row, and skipping a row locked right now
 * by its completing transaction), then looks at the key: a completion that commits after the
 * flag notifies; one that committed before it is seen by the look. Where the flag could not be
 * set (no row yet: the job has not started, or a fast-path transaction holds the key
 * uncommitted; the row was locked; a reconnect dropped a notification) the waiter looks again
 * every 50 ms growing to 250 ms, setting the flag again each time, until the timeout.
 *
 * The same connection hears freed concurrency slots ({@link KeySettledListener.watchFreedSlots}):
 * a run that frees a slot of a concurrency key with waiters names the oldest one, and the BullMQ
 * worker that deferred that job promotes it (`bullmq/concurrency-waiter-wakes.ts`).
 *
 * It needs a session-level LISTEN, so point it at Postgres directly, not at a PgBouncer in
 * transaction mode (the worker and HTTP processes give it `DATABASE_DIRECT_URL` when set). Its
 * `has_waiters` updates are single statements and need no session, but they share its connection.
 *
 * It connects at the first wait (or the first job deferred by a concurrency limit); close it
 * after the workers and servers that use it.
 *
 * @example
 * ```ts
 * import { IdempotencyKeys, KeySettledListener, createIdempotentWorker } from 'idempotent-jobs';
 *
 * const listener = new KeySettledListener({
 *   connectionString: 'postgres://app@127.0.0.1:5432/app', // Postgres itself, not a transaction-mode pooler
 *   schema: 'idempotent_jobs',
 *   onError: (error) => console.warn('listener connection failed; it reconnects', error),
 * });
 * // A duplicate waits up to 5 s for the job holding its key, then replays its result.
 * const worker = createIdempotentWorker({
 *   queue: 'payments',
 *   connection: { host: '127.0.0.1', port: 6379 },
 *   keys: new IdempotencyKeys({ db }),
 *   waitMs: 5_000,
 *   listener,
 *   handler: (ctx) => ctx.transaction((tx) => tx.insertInto('ledger').values({ order_id: ctx.key }).execute()),
 * });
 * // … on shutdown
 * await worker.close();
 * await listener.close();
 * ```
 */
export class KeySettledListener {
  readonly #connectionString: string;
  readonly #channel: string;
  readonly #slotChannel: string;
  readonly #slotWatchers = new Set<(freed: FreedSlot) => void>();
  readonly #table: string;
  readonly #waiters = new Map<string, Set<Waiter>>();
  #client: pg.Client | undefined;
  #connecting: Promise<void> | undefined;
  #closed = false;
  #onError: (error: Error) => void;

  /**
   * @param options.connectionString - Postgres itself (`DATABASE_DIRECT_URL`), for the LISTEN session
   * @param options.schema - schema of the keys table whose keys it waits for
   * @param options.onError - told of connection errors (it reconnects at the next wait); unset: ignored
   */
  constructor(options: { connectionString: string; schema: string; onError?: (error: Error) => void }) {
    this.#connectionString = options.connectionString;
    this.#channel = keySettledChannel(options.schema);
    this.#slotChannel = concurrencySlotFreedChannel(options.schema);
    this.#table = `${pg.escapeIdentifier(options.schema)}.idempotency_keys`;
    this.#onError = options.onError ?? (() => {});
  }

  /**
   * Resolves true when (scope, key) settles within `timeoutMs`, false on timeout or when
   * `signal` aborts (a client hung up, the server is closing). Subscribe first, then check the
   * key's state: a completion that lands in between is not missed.
   */
  async waitForSettled(
    scope: string,
    key: string,
    timeoutMs: number,
    isSettled: () => Promise<boolean>,
    signal?: AbortSignal,
  ): Promise<boolean> {
    if (signal?.aborted) return false;
    await this.#ensureConnected();
    const id = JSON.stringify([scope, key]);
    let wake!: Waiter;
    const settled = new Promise<boolean>((resolve) => (wake = () => resolve(true)));
    const set = this.#waiters.get(id) ?? new Set<Waiter>();
    set.add(wake);
    this.#waiters.set(id, set);
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    let gaveUpAlready = false;
    // Set up before the first look, so an abort during that look is not missed.
    const gaveUp = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), timeoutMs);
      onAbort = () => resolve(false);
      if (signal?.aborted) resolve(false);
      signal?.addEventListener('abort', onAbort, { once: true });
    }).then((value) => {
      gaveUpAlready = true;
      return value;
    });
    const look = async () => {
      await this.#askForNotification(scope, key);
      return isSettled();
    };
    const lookUntilSettled = async (): Promise<boolean> => {
      if (await look()) return true;
      for (let interval = FIRST_LOOK_AFTER_MS; !gaveUpAlready; interval = Math.min(interval * 2, MAX_LOOK_INTERVAL_MS)) {
        await sleep(interval, undefined, { ref: false });
        // A failed look (Postgres briefly unreachable) is not an answer; the next one may be.
        if (!gaveUpAlready && (await look().catch(() => false))) return true;
      }
      return false;
    };
    try {
      return await Promise.race([settled, gaveUp, lookUntilSettled()]);
    } finally {
      gaveUpAlready = true;
      clearTimeout(timer);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
      set.delete(wake);
      if (set.size === 0) this.#waiters.delete(id);
    }
  }

  /**
   * Sets `has_waiters` on the key if it is `processing` and not locked right now (SKIP LOCKED:
   * this connection is shared by every waiter of the process and must never wait on a row).
   * Best effort: when it fails, the waiter's repeated looks still find the settled key.
   */
  async #askForNotification(scope: string, key: string): Promise<void> {
    const client = this.#client;
    if (!client) return;
    await client
      .query(
        `update ${this.#table} set has_waiters = true
          where (scope, key) in (select scope, key from ${this.#table}
                                  where scope = $1 and key = $2 and status = 'processing' and not has_waiters
                                  for update skip locked)`,
        [scope, key],
      )
      .catch(() => {});
  }

  /**
   * Calls `onFreed` whenever a run frees a concurrency slot that a job waits for, naming the
   * oldest such job (BullMQ's worker promotes it if it deferred it); returns the unsubscribe.
   * Connects if not connected: call it again after a connection error (a worker does at each
   * deferral), notifications sent while disconnected are lost, and the waiters then ask again
   * when their deferral ends.
   */
  watchFreedSlots(onFreed: (freed: FreedSlot) => void): () => void {
    this.#slotWatchers.add(onFreed);
    if (!this.#closed) this.#ensureConnected().catch((error: Error) => this.#onError(error));
    return () => this.#slotWatchers.delete(onFreed);
  }

  /**
   * Connects and LISTENs now, if not connected already (it otherwise connects at the first
   * wait); rejects when Postgres cannot be reached. A health check calls it to learn whether
   * the listener can wake waiters.
   */
  connect(): Promise<void> {
    if (this.#closed) return Promise.reject(new Error('the listener is closed'));
    return this.#ensureConnected();
  }

  /** Stops listening and closes the connection. */
  async close(): Promise<void> {
    this.#closed = true;
    const client = this.#client;
    this.#client = undefined;
    await client?.end().catch(() => {});
  }

  #ensureConnected(): Promise<void> {
    if (this.#client) return Promise.resolve();
    this.#connecting ??= this.#connect().finally(() => (this.#connecting = undefined));
    return this.#connecting;
  }

  async #connect(): Promise<void> {
    const client = new pg.Client({ connectionString: this.#connectionString, application_name: 'idempotent-jobs:listener' });
    client.on('notification', (message) => (message.channel === this.#slotChannel ? this.#dispatchFreedSlot(message.payload) : this.#dispatch(message.payload)));
    client.on('error', (error) => {
      this.#onError(error);
      if (this.#client === client) this.#client = undefined;
      client.end().catch(() => {});
    });
    await client.connect();
    await client.query(`LISTEN ${pg.escapeIdentifier(this.#channel)}; LISTEN ${pg.escapeIdentifier(this.#slotChannel)}`);
    if (this.#closed) {
      await client.end();
      return;
    }
    this.#client = client;
  }

  #dispatchFreedSlot(payload: string | undefined): void {
    let freed: FreedSlot;
    try {
      freed = JSON.parse(payload ?? '');
    } catch {
      return;
    }
    for (const onFreed of this.#slotWatchers) onFreed(freed);
  }

  #dispatch(payload: string | undefined): void {
    if (!payload) return;
    let parsed: { scope?: string; key?: string };
    try {
      parsed = JSON.parse(payload);
    } catch {
      return;
    }
    const waiters = this.#waiters.get(JSON.stringify([parsed.scope, parsed.key]));
    if (waiters) for (const wake of waiters) wake();
  }
}
