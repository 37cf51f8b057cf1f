/**
 * The CLI's duration arguments (`keys list --expired-before`, `keys purge --older-than`): a
 * malformed or out-of-range one is refused as bad usage (exit 2) with what to write, never sent
 * to Postgres to fail there as a runtime error.
 */
import { InvalidArgumentError } from 'commander';
import { describe, expect, it } from 'vitest';
import { parseDuration } from '../src/cli/keys-command.js';

describe('parseDuration', () => {
  it('reads a number and a unit', () => {
    expect(parseDuration('90s')).toBe(90_000);
    expect(parseDuration(' 7d ')).toBe(604_800_000);
    expect(parseDuration('5200w')).toBe(5_200 * 604_800_000);
  });

  it('refuses a duration longer than a hundred years (Postgres refused the date it reached back to)', () => {
    expect(() => parseDuration('1000000w')).toThrow(InvalidArgumentError);
    expect(() => parseDuration('1000000w')).toThrow(/longer than any key is kept: at most 5217w/);
    expect(() => parseDuration('9007199254740991ms')).toThrow(/longer than any key is kept/);
  });

  it('refuses what is not a positive duration', () => {
    expect(() => parseDuration('0s')).toThrow(/positive/);
    expect(() => parseDuration('7 days')).toThrow(/not a duration/);
  });
});
