/**
 * The reference model of coalescing keys: what `coalesce_arrive`, `coalesceNext`, the claim, the
 * completion and the janitor do to a key's row and its generations' keys, written as plainly as
 * possible, in memory. The property test (`coalescing-property.test.ts`) feeds it every statement
 * that reached Postgres, in order, and holds each real answer to the model's. Times are
 * milliseconds of the test's clock, which is the database's (same host).
 */

/** A coalescing key's row, as the model keeps it. */
export interface ModelRow {
  generation: number;
  runningJob: string | null;
  runningPayload: unknown;
  pending: unknown;
  /** The newest send time the key took (ms), or null, and the job that sent it. */
  newest: number | null;
  newestJob: string | null;
  finishedGeneration: number | null;
  previousJob: string | null;
  previousGeneration: number | null;
  /** Handed out longer ago than `staleMs` (the test backdates `assigned_at`). */
  stale: boolean;
}

/** A generation's idempotency key. */
interface ModelKey {
  status: 'processing' | 'completed';
  /** Held under a live lease by an owner (false: released, or its lease ran out). */
  held: boolean;
  /** Kept briefly (a job's short retention): the janitor deletes it once it completed. */
  brief: boolean;
}

/** The model's answer to an arrival. */
export type ModelArrival = { action: 'run'; generation: number; payload: unknown } | { action: 'coalesced' } | { action: 'finished'; generation: number | null };

/** One committed run: the generation's key and the payload it ran with. */
export interface ModelRun {
  readonly key: string;
  readonly payload: unknown;
}

export class CoalescingModel {
  readonly rows = new Map<string, ModelRow>();
  readonly keys = new Map<string, ModelKey>();
  readonly runs: ModelRun[] = [];
  /** The payload each generation was handed out with. */
  readonly #payloadOf = new Map<string, unknown>();
  /** The send time given at a job's first arrival (`coalescing_arrivals`), by `key/job`. */
  readonly #given = new Map<string, number>();

  constructor(
    /** The schema's generation floor when the model starts. */
    public floor: number,
  ) {}

  /** `coalesce_arrive(key, job, payload, sentAt)` at `now` (see `sql/coalescing.ts`). */
  arrive(key: string, job: string, payload: unknown, sentAt: number | undefined, now: number): ModelArrival {
    let row = this.rows.get(key);
    if (!row) {
      row = { generation: this.floor, runningJob: null, runningPayload: null, pending: null, newest: null, newestJob: null, finishedGeneration: null, previousJob: null, previousGeneration: null, stale: false };
      this.rows.set(key, row);
    }
    // The send time its first arrival was given, or the broker's when not ahead of the clock, or the clock's, remembered.
    let sent = this.#given.get(`${key}/${job}`);
    if (sent === undefined) {
      if (sentAt !== undefined && sentAt <= now) sent = sentAt;
      else this.#given.set(`${key}/${job}`, (sent = now));
    }
    const runKey = `${key}#${row.generation}`;
    const ended = (row.finishedGeneration ?? -1) >= row.generation || this.keys.get(runKey)?.status === 'completed';
    if (row.runningJob === job) {
      if (!ended) return { action: 'run', generation: row.generation, payload: row.runningPayload };
      if (row.pending !== null) return this.#handOver(key, row);
      row.previousJob = job;
      row.previousGeneration = row.generation;
      row.runningJob = null;
      return { action: 'finished', generation: row.generation };
    }
    if (row.previousJob === job) return { action: 'finished', generation: row.previousGeneration };
    if (row.newestJob === job || (row.newest !== null && sent < row.newest)) return { action: 'coalesced' };
    row.newest = sent;
    row.newestJob = job;
    if (!(row.runningJob === null || ended || (row.stale && !this.keys.has(runKey)))) {
      row.pending = payload;
      return { action: 'coalesced' };
    }
    if (row.runningJob !== null) {
      row.previousJob = row.runningJob;
      row.previousGeneration = row.generation;
    }
    row.generation++;
    row.runningJob = job;
    row.runningPayload = payload;
    row.pending = null;
    row.stale = false;
    this.#payloadOf.set(`${key}#${row.generation}`, payload);
    return { action: 'run', generation: row.generation, payload };
  }

  /** `coalesceNext(key, job, generation)`: the successor, or undefined. */
  next(key: string, job: string, generation: number): { generation: number; payload: unknown } | undefined {
    const row = this.rows.get(key);
    if (!row || row.runningJob !== job || row.generation !== generation || row.pending === null) return undefined;
    const { generation: handed, payload } = this.#handOver(key, row) as { generation: number; payload: unknown };
    return { generation: handed, payload };
  }

  #handOver(key: string, row: ModelRow): ModelArrival {
    row.generation++;
    row.runningPayload = row.pending;
    row.pending = null;
    row.stale = false;
    this.#payloadOf.set(`${key}#${row.generation}`, row.runningPayload);
    return { action: 'run', generation: row.generation, payload: row.runningPayload };
  }

  /** A lease claim of a generation's key: held, in progress (another owner's live lease), or completed (replayed). */
  claim(key: string): 'held' | 'in-progress' | 'completed' {
    const found = this.keys.get(key);
    if (!found) {
      this.keys.set(key, { status: 'processing', held: true, brief: false });
      return 'held';
    }
    if (found.status === 'completed') return 'completed';
    if (found.held) return 'in-progress';
    found.held = true;
    return 'held';
  }

  /**
   * The fenced completion committed: the generation's run, with the payload it ran. Returns what
   * is wrong with it, if anything: a generation never handed out, a second commit, another payload.
   */
  complete(key: string, ranWith: unknown, brief: boolean): string | undefined {
    const found = this.keys.get(key);
    if (!found || found.status !== 'processing') return `${key} completed while ${found ? found.status : 'absent'} in the model`;
    found.status = 'completed';
    found.held = false;
    found.brief = brief;
    this.runs.push({ key, payload: ranWith });
    if (this.runs.filter((run) => run.key === key).length > 1) return `${key} committed twice`;
    if (!this.#payloadOf.has(key)) return `${key} ran, but was never handed out`;
    if (JSON.stringify(this.#payloadOf.get(key)) !== JSON.stringify(ranWith)) return `${key} ran ${JSON.stringify(ranWith)}, handed out with ${JSON.stringify(this.#payloadOf.get(key))}`;
    return undefined;
  }

  /** The key released for a retry: claimable at once. */
  release(key: string): void {
    const found = this.keys.get(key);
    if (found?.status === 'processing') found.held = false;
  }

  /** Time passes: every lease runs out. */
  expireLeases(): void {
    for (const found of this.keys.values()) if (found.status === 'processing') found.held = false;
  }

  /** The janitor deletes the completed keys kept briefly, recording the end of a row's current generation. */
  deleteBriefKeys(): void {
    for (const [name, found] of this.keys) {
      if (found.status !== 'completed' || !found.brief) continue;
      this.keys.delete(name);
      const at = name.lastIndexOf('#');
      const row = this.rows.get(name.slice(0, at));
      const generation = Number(name.slice(at + 1));
      if (row && row.generation === generation) row.finishedGeneration = generation;
    }
  }

  /**
   * The janitor, `idleMs` after every one of `keys` was last handed out: deletes the rows with no
   * successor pending and no run in flight, raising the floor. Returns the keys whose row went.
   */
  deleteIdleRows(keys: readonly string[]): string[] {
    const deleted: string[] = [];
    for (const key of keys) {
      const row = this.rows.get(key);
      if (!row) continue;
      row.stale = true;
      if (row.pending !== null || this.keys.get(`${key}#${row.generation}`)?.status === 'processing') continue;
      this.rows.delete(key);
      this.floor = Math.max(this.floor, row.generation);
      deleted.push(key);
    }
    return deleted;
  }
}
