/**
 * The worker timing options' relations: each contradiction is refused at construction with a
 * message naming the option, never accepted to misbehave later. No service is needed.
 */
import { describe, expect, it } from 'vitest';
import { ValidationError } from '../src/index.js';
import { resolveWorkerTiming } from '../src/consumer/worker-timing.js';

function refusal(options: Parameters<typeof resolveWorkerTiming>[0]): ValidationError {
  try {
    resolveWorkerTiming(options, 30_000);
  } catch (error) {
    if (error instanceof ValidationError) return error;
    throw error;
  }
  throw new Error('expected a ValidationError');
}

describe('the starvation bound of concurrency limits', () => {
  it('is refused below the longest deferral, which a waiter stays away for (the bound would hold nothing back)', () => {
    // deferMaxMs 2 000 with the default jitter (0.25): a waiter may come back 2.5 s later.
    const error = refusal({ deferMaxMs: 2_000, concurrencyStarvationMs: 2_000 });
    expect(error.message).toMatch(/concurrencyStarvationMs \(2000\) must be at least .* 2500/);
    expect(refusal({ deferMaxMs: 10_000, deferJitterRatio: 0, concurrencyStarvationMs: 9_999 }).message).toMatch(/concurrencyStarvationMs/);
  });

  it('is accepted from the longest deferral up, and by default', () => {
    expect(resolveWorkerTiming({ deferMaxMs: 2_000, concurrencyStarvationMs: 2_500 }, 30_000).concurrencyStarvationMs).toBe(2_500);
    expect(resolveWorkerTiming({}, 30_000).concurrencyStarvationMs).toBe(30_000);
  });

  it('by default, grows to the longest deferral when that is longer', () => {
    expect(resolveWorkerTiming({ deferMaxMs: 40_000 }, 30_000).concurrencyStarvationMs).toBe(50_000);
  });
});
