/**
 * The BullMQ worker's waking of jobs it deferred for a concurrency limit: a notification naming
 * one of them promotes it, once; one that arrives while the job is still being moved to delayed
 * promotes it once the move is done; other queues' and unknown jobs are left alone.
 */
import type { Job } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { ConcurrencyWaiterWakes } from '../src/bullmq/concurrency-waiter-wakes.js';
import type { FreedSlot, KeySettledListener } from '../src/store/key-settled-listener.js';

function setUp() {
  let notify: (freed: FreedSlot) => void = () => {};
  const listener = { watchFreedSlots: (onFreed: (freed: FreedSlot) => void) => ((notify = onFreed), () => {}) } as unknown as KeySettledListener;
  const promoted: string[] = [];
  const job = (id: string) => ({ id, promote: async () => void promoted.push(id) }) as unknown as Job;
  return { wakes: new ConcurrencyWaiterWakes(listener, 'syncs'), notify: (freed: FreedSlot) => notify(freed), promoted, job };
}

describe('ConcurrencyWaiterWakes', () => {
  it('promotes a deferred job its notification names, once, and nothing of another queue or unknown', async () => {
    const { wakes, notify, promoted, job } = setUp();
    wakes.deferring(job('a'))();
    notify({ group: 'tenant:acme', queue: 'other', jobId: 'a' });
    notify({ group: 'tenant:acme', queue: 'syncs', jobId: 'z' });
    notify({ group: 'tenant:acme', queue: 'syncs', jobId: 'a' });
    notify({ group: 'tenant:acme', queue: 'syncs', jobId: 'a' });
    await Promise.resolve();
    expect(promoted).toEqual(['a']);
  });

  it('a slot freed while the job is still being moved to delayed promotes it once the move is done', async () => {
    const { wakes, notify, promoted, job } = setUp();
    const moved = wakes.deferring(job('b'));
    notify({ group: 'tenant:acme', queue: 'syncs', jobId: 'b' });
    await Promise.resolve();
    expect(promoted).toEqual([]);
    moved();
    await Promise.resolve();
    expect(promoted).toEqual(['b']);
  });

  it('a job running again, or a closed worker, wakes nothing', async () => {
    const { wakes, notify, promoted, job } = setUp();
    wakes.deferring(job('c'))();
    wakes.running(job('c'));
    notify({ group: 'tenant:acme', queue: 'syncs', jobId: 'c' });
    wakes.deferring(job('d'))();
    wakes.close();
    notify({ group: 'tenant:acme', queue: 'syncs', jobId: 'd' });
    await Promise.resolve();
    expect(promoted).toEqual([]);
  });
});
