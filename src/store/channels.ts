/**
 * LISTEN/NOTIFY channel names. They carry the schema so that several deployments (or test
 * files) sharing one database never wake each other.
 */

/** Notified, at commit, with `{"scope","key"}` whenever a key becomes completed or failed. */
export const keySettledChannel = (schema: string) => `${schema}_key_settled`;

/**
 * Notified, at commit, with `{"group","queue","jobId"}` when a run frees a slot of a concurrency
 * key that has a waiter: the oldest waiter's job, for its worker to promote (see
 * `sql/concurrency-slot-wakes.ts`).
 */
export const concurrencySlotFreedChannel = (schema: string) => `${schema}_slot_freed`;
