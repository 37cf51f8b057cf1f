import { StoreUnavailableError } from '../errors.js';
import type { ConcurrencySlot, IdempotencyKeys } from '../protocol/idempotency-keys.js';
import type { JobLogger } from './job-logger.js';

/**
 * A run could no longer show that it holds its concurrency slots: another run took one (its
 * time had run out), or no renewal was confirmed for a whole lease (Postgres unreachable, the
 * process stalled), after which another run may have taken it. A fast-path run rolls back
 * with it, so that no effect commits outside its limit. Like a store fault, it uses no attempt
 * and stores nothing on the key: the job is deferred and asks for a slot again.
 * `code`: `'STORE_UNAVAILABLE'`.
 */
export class ConcurrencySlotLostError extends StoreUnavailableError {
  constructor(scope: string, key: string, groups: readonly string[], why: string) {
    super(scope, key, 'concurrency slot renewal', { cause: new Error(why) });
    this.message =
      `The run of idempotency key "${key}" in scope "${scope}" lost its slot of concurrency key ${groups.map((g) => `"${g}"`).join(', ')} (${why}): ` +
      'its transaction is rolled back, so that it does not commit outside its limit, and the job is deferred without using an attempt.';
    this.name = 'ConcurrencySlotLostError';
  }
}

/** The run in a slot: its renewals and its loss are told under its key, in its log. */
export interface SlotHolder {
  readonly scope: string;
  readonly key: string;
  readonly log: JobLogger;
}

/** What a slot heartbeat needs. */
export interface SlotHeartbeatOptions {
  readonly keys: IdempotencyKeys;
  /** Who runs in the slots: read at each renewal, so a slot kept for the next run of its key (`ConcurrencySlotPool`) names that run. */
  readonly holder: () => SlotHolder;
  /** The slots held. */
  readonly slots: readonly ConcurrencySlot[];
  /** How long each renewal holds them; also how long without a confirmed renewal before they count as lost. */
  readonly leaseMs: number;
  /** How often to renew. */
  readonly heartbeatMs: number;
  /** When the slots were last known held: just before they were taken (`performance.now()`). */
  readonly heldSince: number;
  /** Told when a renewal sent at `sentAt` (`performance.now()`) was confirmed for every slot. */
  readonly onRenewed?: (sentAt: number) => void;
}

/**
 * Keeps a run's concurrency slots for as long as it runs: every `heartbeatMs` their time is
 * renewed to `leaseMs` from now (`renewConcurrencySlots`). A slot is held by its time alone:
 * without the renewal a run longer than the lease let another job of its key in, and a limit
 * of 1 ran 3 at once.
 * A run shorter than `heartbeatMs` sends nothing more.
 *
 * *Bounded by its slot:* `signal` aborts, with a {@link ConcurrencySlotLostError}, when a
 * renewal finds a slot taken by another run, or when no renewal was confirmed for `leaseMs`
 * (counted from when the confirmed one was sent: the slot's time may be up, and another run in
 * it). That deadline has a timer of its own, re-armed by each confirmed renewal: checked only at
 * the beats, a renewal that hung (a loaded or stalled Postgres) held the check off until it
 * answered, and another run took the slot while this one still ran. A renewal that fails is
 * otherwise tried again at the next beat, as the lease's is.
 */
export function startSlotHeartbeat(options: SlotHeartbeatOptions): { readonly signal: AbortSignal; readonly stop: () => void } {
  const { keys, holder, slots, leaseMs } = options;
  const controller = new AbortController();
  const groups = slots.map((slot) => slot.group);
  let inFlight = false;
  let stopped = false;
  let deadline: NodeJS.Timeout | undefined;
  const lose = (why: string) => {
    stop();
    const { scope, key, log } = holder();
    log.warn({ outcome: 'concurrency-slot-lost', concurrencyKeys: groups }, `concurrency slot lost: ${why}`);
    controller.abort(new ConcurrencySlotLostError(scope, key, groups, why));
  };
  /** The slots count as lost `leaseMs` after `confirmedAt`, unless a later renewal is confirmed first. */
  const armDeadline = (confirmedAt: number) => {
    clearTimeout(deadline);
    deadline = setTimeout(() => lose(`no renewal confirmed for ${leaseMs} ms`), Math.max(0, confirmedAt + leaseMs - performance.now()));
    deadline.unref();
  };
  armDeadline(options.heldSince);
  const timer = setInterval(async () => {
    if (inFlight) return;
    inFlight = true;
    const sentAt = performance.now();
    try {
      const { scope, key } = holder();
      const renewed = await keys.renewConcurrencySlots(scope, key, slots, leaseMs);
      if (stopped) return;
      if (renewed < slots.length) lose('its time ran out and another run took it');
      else {
        armDeadline(sentAt);
        options.onRenewed?.(sentAt);
      }
    } catch (error) {
      if (!stopped) holder().log.warn({ err: error }, 'concurrency slot renewal failed; trying again at the next beat');
    } finally {
      inFlight = false;
    }
  }, options.heartbeatMs);
  timer.unref();
  function stop() {
    stopped = true;
    clearInterval(timer);
    clearTimeout(deadline);
  }
  return { signal: controller.signal, stop };
}
