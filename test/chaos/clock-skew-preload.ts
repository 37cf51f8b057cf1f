/**
 * Loaded with `node --import tsx --import <this file>` (see `clock-skew.ts`): skews this
 * process's wall clock by `CLOCK_SKEW_MS` before any other module reads it.
 */
import { clockSkewFromEnv, skewedDate } from './clock-skew.js';

const offset = clockSkewFromEnv();
if (offset !== undefined && offset !== 0) globalThis.Date = skewedDate(offset);
