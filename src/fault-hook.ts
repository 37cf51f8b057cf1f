/**
 * Named points inside the protocol where the chaos suite crashes a process, or makes the store
 * fail:
 * - `after-claim`: the key is claimed, the handler has not started;
 * - `before-commit`: inside the effect transaction, completion written, COMMIT not yet sent;
 * - `after-commit`: effect and completion committed, BullMQ not yet told the job finished;
 * - `before-hand-over`: a coalescing job's generation ended, the hand-over to the pending
 *   successor not yet sent (a store fault thrown here is one the hand-over met);
 * - `after-hand-over`: the hand-over answered, the job not yet going on (a store fault thrown
 *   here is an answer lost after Postgres applied the hand-over);
 * - `relay-after-add`: the outbox relay added jobs to BullMQ but has not marked them sent.
 */
export type FaultPoint = 'after-claim' | 'before-commit' | 'after-commit' | 'before-hand-over' | 'after-hand-over' | 'relay-after-add';

/**
 * Called at each {@link FaultPoint} when set. Off by default: an unset hook costs one
 * `undefined` check. A hook may throw, or end the process, to simulate a crash there.
 */
export type FaultHook = (point: FaultPoint, context: { readonly scope?: string; readonly key?: string }) => void | Promise<void>;
