/**
 * How many runs a property test makes, and its seed: a bounded number by default, so that each
 * property file stays well under a minute in `npm test`; more for a long (nightly) run with
 * `PROPERTY_RUNS`; one run repeated with `FC_SEED` (each property prints its seed).
 */

/** fast-check's `numRuns` and `seed` for a property, printing the seed under `name`. */
export function propertyRuns(name: string, defaultRuns: number, env: NodeJS.ProcessEnv = process.env): { readonly numRuns: number; readonly seed: number } {
  const asked = env.PROPERTY_RUNS;
  const numRuns = asked === undefined || asked === '' ? defaultRuns : Number(asked);
  if (!Number.isInteger(numRuns) || numRuns < 1) throw new Error(`PROPERTY_RUNS must be a whole number from 1, not "${asked}"`);
  const seed = env.FC_SEED === undefined || env.FC_SEED === '' ? Math.floor(Math.random() * 2 ** 31) : Number(env.FC_SEED);
  if (!Number.isInteger(seed)) throw new Error(`FC_SEED must be a whole number, not "${env.FC_SEED}"`);
  console.log(`${name}: ${numRuns} runs, fast-check seed ${seed} (reproduce with FC_SEED=${seed})`);
  return { numRuns, seed };
}
