import type { ConcurrencySlot, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import { startSlotHeartbeat, type SlotHolder } from './concurrency-slot-heartbeat.js';
import type { JobLogger } from './job-logger.js';
import type { ConcurrencyLimit } from './wire-contract.js';

/**
 * A slot row taken for a run, with its heartbeat: from its take until it is freed, every
 * `heartbeatMs` its time is renewed, and `lost` aborts once it can no longer be shown held
 * (`concurrency-slot-heartbeat.ts`). A slot kept by a {@link ConcurrencySlotPool} keeps its
 * heartbeat between the runs it is lent to, so a run lent one pays for no timer of its own.
 */
export class HeldSlot {
  readonly slot: ConcurrencySlot;
  /** The limit it was taken under: lent again only to a job that names the same. */
  readonly limit: number;
  /** When the take that got it from the database was sent (`performance.now()`). */
  readonly takenAt: number;
  /** When its last confirmed take or renewal was sent: its row is held until at least this + the lease. */
  confirmedAt: number;
  /** The run in it now, or the worker keeping it: who its renewals and its loss are told under. */
  holder: SlotHolder;
  /** The key it was taken for (its row names it). */
  readonly takenFor: { readonly scope: string; readonly key: string };
  /** Who it is told under while a pool keeps it with no run in it: made once, at its first give-back. */
  #kept: SlotHolder | undefined;
  /** Since when no run holds it (kept by a pool); undefined while a run does. */
  idleSince: number | undefined;
  readonly #heartbeat: ReturnType<typeof startSlotHeartbeat>;

  constructor(keys: IdempotencyKeys, slot: ConcurrencySlot, limit: number, holder: SlotHolder, takenAt: number, timing: { readonly leaseMs: number; readonly heartbeatMs: number }) {
    this.slot = slot;
    this.limit = limit;
    this.holder = holder;
    this.takenFor = { scope: holder.scope, key: holder.key };
    this.takenAt = takenAt;
    this.confirmedAt = takenAt;
    this.#heartbeat = startSlotHeartbeat({
      keys,
      holder: () => this.holder,
      slots: [slot],
      leaseMs: timing.leaseMs,
      heartbeatMs: timing.heartbeatMs,
      heldSince: takenAt,
      onRenewed: (sentAt) => (this.confirmedAt = sentAt),
    });
  }

  /** The slot kept by a worker whose log is `log`, no run in it: told under the key it was taken for, in that log. */
  keptBy(log: JobLogger): void {
    this.holder = this.#kept ??= { ...this.takenFor, log };
  }

  /** Aborts, with a `ConcurrencySlotLostError`, once the slot can no longer be shown held: a run in it must not commit. */
  get lost(): AbortSignal {
    return this.#heartbeat.signal;
  }

  /** Frees the slot's row (if its owner still holds it), its heartbeat stopped first. */
  async free(keys: IdempotencyKeys): Promise<void> {
    this.#heartbeat.stop();
    const { scope, key, log } = this.holder;
    await keys.releaseConcurrencySlot(scope, key, this.slot).catch((error: unknown) => {
      log.warn({ err: error, concurrencyKey: this.slot.group }, 'could not free the concurrency slot; it frees itself when its time is up');
    });
  }
}

/** What a {@link ConcurrencySlotPool} needs. */
export interface SlotPoolOptions {
  readonly keys: IdempotencyKeys;
  /** How long after its take from the database a slot may be lent to another run. */
  readonly reuseMs: number;
  /** How long a slot no run holds is kept for the next one before it is freed. */
  readonly idleMs: number;
  /** The slots' heartbeat period: a slot is lent only while half of it has not passed since its time was last confirmed. */
  readonly heartbeatMs: number;
  /** The worker's log: a kept slot's renewals and loss are told there while no run is in it (not in the log of the run that was). */
  readonly log: JobLogger;
}

/**
 * The slot rows of a worker's concurrency keys, kept between runs: a run that ends gives its slot
 * back, and the next run of the same concurrency key (and limit) on this worker is lent it, with
 * no statement at all, where taking one and freeing it cost a statement and a commit each.
 *
 * *What holds the limit:* a slot row counts against its key's limit while it is live, whoever
 * holds it, and the pool lends each slot to one run at a time. The slot's heartbeat renews its
 * time for as long as the pool keeps it, and a run in a slot that can no longer be shown held
 * rolls back, as in a slot of its own. A worker that dies frees its kept slots when their time is
 * up, as a run's.
 *
 * *What bounds the hold:* a slot is lent again only within `reuseMs` of its take, then freed when
 * its run ends (a waiter elsewhere is woken by that release, as by any); a slot no run holds is
 * freed within `idleMs` or two; and a concurrency key whose take on this worker was refused (it
 * is at its limit) or found another key waiting gets no slot lent for `reuseMs`: every slot of it
 * is freed as its run ends, so the waiters' order decides again. So a worker keeps a slot from a waiter
 * elsewhere at most `reuseMs` longer than a run. A slot is lent only while less than half a
 * heartbeat has passed since its time was last confirmed, so that its next renewal comes well
 * before that time is up.
 *
 * A slot's take records the key it was taken for (`key_concurrency_limits`, which the sweeper
 * reads for a key left `processing`); a lent slot records nothing, so a leased run lent one has
 * its claim record its key's limits in the claim's own statement (`ClaimOptions.concurrency`).
 */
export class ConcurrencySlotPool {
  readonly #options: SlotPoolOptions;
  /** The slots no run holds, per concurrency key and limit; the last given back is lent first. */
  readonly #idle = new Map<string, HeldSlot[]>();
  #idleCount = 0;
  /** Concurrency keys contended here (a take refused, or another key found waiting), and until when none of their slots is lent. */
  readonly #contendedUntil = new Map<string, number>();
  #sweep: NodeJS.Timeout | undefined;
  #closed = false;

  constructor(options: SlotPoolOptions) {
    this.#options = options;
  }

  /** A slot of `limit`'s key that can be lent now to `holder`'s run, taken out of the pool; undefined: take one. */
  lend(limit: ConcurrencyLimit, holder: SlotHolder): HeldSlot | undefined {
    const key = poolKey(limit.key, limit.limit);
    const idle = this.#idle.get(key);
    const now = performance.now();
    if (!idle || this.#isContended(limit.key, now)) return undefined;
    let lent: HeldSlot | undefined;
    while (!lent && idle.length > 0) {
      const slot = idle.pop()!;
      this.#idleCount--;
      if (this.#lendable(slot, now)) lent = slot;
      else void slot.free(this.#options.keys);
    }
    if (idle.length === 0) this.#idle.delete(key);
    if (lent) {
      lent.idleSince = undefined;
      lent.holder = holder;
    }
    return lent;
  }

  /** How many concurrency keys are remembered as contended (expired ones included until pruned): for tests and diagnostics. */
  get contendedKeys(): number {
    return this.#contendedUntil.size;
  }

  /** How long after its take a slot may be lent again. */
  get reuseMs(): number {
    return this.#options.reuseMs;
  }

  /**
   * A take of `group` was refused (it is at its limit), or found another key waiting: its slots
   * are freed as their runs end, none lent, for `reuseMs`, so that the waiters get them.
   */
  contended(group: string): void {
    const now = performance.now();
    // Pruned here too: a worker whose keys are all contended keeps no slot, so no sweep runs.
    if (this.#contendedUntil.size >= PRUNE_CONTENDED_AT) for (const [key, until] of this.#contendedUntil) if (until <= now) this.#contendedUntil.delete(key);
    this.#contendedUntil.set(group, now + this.#options.reuseMs);
    for (const [key, idle] of this.#idle) {
      if (idle[0]?.slot.group !== group) continue;
      this.#idle.delete(key);
      this.#idleCount -= idle.length;
      for (const slot of idle) void slot.free(this.#options.keys);
    }
  }

  /**
   * A run ended in `slot`: kept for the next run of its key (undefined), or freed (its reuse is
   * over, it was lost, its key is contended, or the pool is closed): the release, to wait for.
   */
  giveBack(slot: HeldSlot): Promise<void> | undefined {
    const now = performance.now();
    if (this.#closed || this.#isContended(slot.slot.group, now) || !this.#lendable(slot, now)) return slot.free(this.#options.keys);
    const key = poolKey(slot.slot.group, slot.limit);
    const idle = this.#idle.get(key);
    if (idle) idle.push(slot);
    else this.#idle.set(key, [slot]);
    slot.idleSince = now;
    slot.keptBy(this.#options.log);
    this.#idleCount++;
    // Not unref'd: a process that ends frees its kept slots first (within idleMs or two), as its runs free theirs.
    this.#sweep ??= setInterval(() => void this.#freeIdle(this.#options.idleMs), this.#options.idleMs);
    return undefined;
  }

  /** Frees every kept slot, and every slot given back from now on. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#freeIdle(0);
  }

  /** Frees the kept slots idle for `idleForMs` or more, or no longer lendable. */
  #freeIdle(idleForMs: number): Promise<void> {
    const now = performance.now();
    const freed: Array<Promise<void>> = [];
    for (const [key, idle] of this.#idle) {
      const kept: HeldSlot[] = [];
      for (const slot of idle) {
        if (now - slot.idleSince! < idleForMs && this.#lendable(slot, now)) kept.push(slot);
        else freed.push(slot.free(this.#options.keys));
      }
      this.#idleCount -= idle.length - kept.length;
      if (kept.length === 0) this.#idle.delete(key);
      else this.#idle.set(key, kept);
    }
    for (const [group, until] of this.#contendedUntil) if (until <= now) this.#contendedUntil.delete(group);
    if (this.#idleCount === 0 && this.#sweep) {
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
    return Promise.all(freed).then(() => {});
  }

  #lendable(slot: HeldSlot, now: number): boolean {
    return !slot.lost.aborted && now - slot.takenAt < this.#options.reuseMs && now - slot.confirmedAt < this.#options.heartbeatMs / 2;
  }

  #isContended(group: string, now: number): boolean {
    const until = this.#contendedUntil.get(group);
    return until !== undefined && until > now;
  }
}

/** How many contended keys are remembered before the expired ones are dropped at the next. */
const PRUNE_CONTENDED_AT = 64;

function poolKey(group: string, limit: number): string {
  return `${limit}\u0000${group}`;
}
