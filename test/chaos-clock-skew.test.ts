/**
 * The chaos runs' skewed clocks (`chaos/clock-skew.ts`): a skewed process must read its wall
 * clock off by the offset, in `Date.now()`, `new Date()` and `Date()`, while dates built from
 * a value stay what they are; else a racing-schedulers run would test nothing about clocks.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { CLOCK_SKEW_VARIABLE, clockSkewArgs, clockSkewEnv, clockSkewFromEnv, skewedDate } from './chaos/clock-skew.js';

const run = promisify(execFile);

describe('skewedDate', () => {
  const OFFSET = 7 * 60_000;
  const Skewed = skewedDate(OFFSET);

  it('moves now(), new Date() and Date() by the offset', () => {
    const before = Date.now();
    const now = Skewed.now();
    const created = new Skewed().getTime();
    const text = Date.parse(Skewed());
    const after = Date.now();
    for (const value of [now, created]) {
      expect(value).toBeGreaterThanOrEqual(before + OFFSET);
      expect(value).toBeLessThanOrEqual(after + OFFSET);
    }
    // Date() has second precision.
    expect(text).toBeGreaterThanOrEqual(Math.floor((before + OFFSET) / 1000) * 1000);
    expect(text).toBeLessThanOrEqual(after + OFFSET);
  });

  it('leaves dates built from a value, parse and UTC as they are; its dates are Dates', () => {
    expect(new Skewed(5).getTime()).toBe(5);
    expect(new Skewed('2026-12-02T11:00:00.000Z').toISOString()).toBe('2026-12-02T11:00:00.000Z');
    expect(Skewed.parse('1970-01-01T00:00:00.010Z')).toBe(10);
    expect(Skewed.UTC(1970, 0, 1)).toBe(0);
    expect(new Skewed()).toBeInstanceOf(Date);
    expect(new Date()).toBeInstanceOf(Skewed);
    class Subclass extends Skewed {}
    expect(new Subclass().getTime()).toBeGreaterThan(Date.now() + OFFSET - 1_000);
    expect(new Subclass()).toBeInstanceOf(Subclass);
  });

  it('refuses an offset that is not a number', () => {
    expect(() => skewedDate(Number.NaN)).toThrow(/finite number of ms/);
  });
});

describe('clockSkewFromEnv', () => {
  it('reads an integer offset, none when unset or empty, and refuses anything else', () => {
    expect(clockSkewFromEnv({ [CLOCK_SKEW_VARIABLE]: '-120000' })).toBe(-120_000);
    expect(clockSkewFromEnv({})).toBeUndefined();
    expect(clockSkewFromEnv({ [CLOCK_SKEW_VARIABLE]: ' ' })).toBeUndefined();
    expect(() => clockSkewFromEnv({ [CLOCK_SKEW_VARIABLE]: '2m' })).toThrow(/CLOCK_SKEW_MS must be an integer number of ms/);
  });
});

describe('the preload', () => {
  it('skews a child process by CLOCK_SKEW_MS before its own code runs, and refuses a bad value', async () => {
    const script = 'console.log(JSON.stringify({ now: Date.now(), created: new Date().getTime(), real: performance.timeOrigin + performance.now() }))';
    const { stdout } = await run(process.execPath, [...clockSkewArgs(), '-e', script], { env: { ...process.env, ...clockSkewEnv(-180_000) } });
    const seen = JSON.parse(stdout) as { now: number; created: number; real: number };
    // performance.timeOrigin is taken from the real clock at start.
    expect(seen.now - seen.real).toBeGreaterThan(-181_000);
    expect(seen.now - seen.real).toBeLessThan(-179_000);
    expect(seen.created - seen.real).toBeGreaterThan(-181_000);
    expect(seen.created - seen.real).toBeLessThan(-179_000);
    await expect(run(process.execPath, [...clockSkewArgs(), '-e', '0'], { env: { ...process.env, [CLOCK_SKEW_VARIABLE]: 'soon' } })).rejects.toThrow(/CLOCK_SKEW_MS must be an integer/);
  }, 60_000);
});
