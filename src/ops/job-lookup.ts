/**
 * Whether the broker still has a job: `pending` (waiting, delayed, prioritized, active, waiting for
 * children: it will run or is running), `finished` (completed or failed: it will not run
 * again) or `missing` (removed, evicted, or never added).
 */
export type JobPresence = 'pending' | 'finished' | 'missing';

/**
 * How the sweeper reaches the queues: whether a job still exists, and re-adding a lost one.
 * Defined here, where it is used; `BullmqJobLookup` satisfies it for BullMQ, and the process
 * that runs the sweeper hands one in.
 */
export interface JobLookup {
  /** Whether `queue` still has one of `jobIds`: see {@link JobPresence}. */
  presence(queue: string, jobIds: readonly string[]): Promise<JobPresence>;
  /** Adds a lost job again under its id; `'exists'` when a pending job already holds the id. `BullmqJobLookup.reenqueue` says how BullMQ does it. */
  reenqueue(request: {
    queue: string;
    jobId: string;
    name: string;
    data: unknown;
    opts?: { attempts?: number; backoff?: { type: 'fixed' | 'exponential'; delay: number } };
  }): Promise<'added' | 'exists'>;
}
