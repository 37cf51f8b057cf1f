import { ValidationError } from '../errors.js';

/**
 * Checks one count or delay of a broker consumer's options (`concurrency`, `maxAttempts`,
 * `retryDelayMs`, …): a positive integer, else a {@link ValidationError} naming the option.
 * Returns the value.
 */
export function positiveIntegerOption(field: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) {
    throw new ValidationError('INVALID_OPTIONS', field, `Invalid consumer option ${field}: expected a positive integer, got ${value}.`);
  }
  return value;
}
