import pg from 'pg';
import { keySettledChannel } from './channels.js';

type Waiter = () => void;

/**
 * One dedicated connection per process that LISTENs for keys becoming completed or failed, so
 * a duplicate can wait for the owner to finish without polling. Reconnects after errors; a
 * waiter whose notification is missed during a reconnect simply times out and looks again.
 *
 * It needs a session-level LISTEN, so point it at Postgres directly, not at a PgBouncer in
 * transaction mode.
 */
export class KeySettledListener {
  readonly #connectionString: string;
  readonly #channel: string;
  readonly #waiters = new Map<string, Set<Waiter>>();
  #client: pg.Client | undefined;
  #connecting: Promise<void> | undefined;
  #closed = false;
  #onError: (error: Error) => void;

  constructor(options: { connectionString: string; schema: string; onError?: (error: Error) => void }) {
    this.#connectionString = options.connectionString;
    this.#channel = keySettledChannel(options.schema);
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
    try {
      if (await isSettled()) return true;
      const gaveUp = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), timeoutMs);
        onAbort = () => resolve(false);
        signal?.addEventListener('abort', onAbort, { once: true });
      });
      return await Promise.race([settled, gaveUp]);
    } finally {
      clearTimeout(timer);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
      set.delete(wake);
      if (set.size === 0) this.#waiters.delete(id);
    }
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
    client.on('notification', (message) => this.#dispatch(message.payload));
    client.on('error', (error) => {
      this.#onError(error);
      if (this.#client === client) this.#client = undefined;
      client.end().catch(() => {});
    });
    await client.connect();
    await client.query(`LISTEN ${pg.escapeIdentifier(this.#channel)}`);
    if (this.#closed) {
      await client.end();
      return;
    }
    this.#client = client;
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
