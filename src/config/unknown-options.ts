/**
 * Refusing misspelt option names and unknown enum values from callers the type checker never
 * saw (plain JavaScript, `any`, options built at run time): `{ concurency: 4 }` would otherwise
 * be accepted and ignored, leaving the default in force without a word. The error names the
 * option, where it was passed and the closest known name, as TypeScript's own "did you mean"
 * would.
 */
import { ValidationError } from '../errors.js';

/** Names missing from a list meant to hold every option of `T`. */
type MissingNames<T, Names extends readonly PropertyKey[]> = Exclude<keyof T, Names[number]>;

/**
 * The option names of `T`, checked by the compiler to be all of them: a list that leaves one
 * out does not type-check (the error names the missing option), so an option added to the
 * interface cannot be refused as unknown at run time.
 *
 * @example const WORKER_OPTIONS = optionNames<IdempotentWorkerOptions>()(['queue', 'keys', ...]);
 */
export function optionNames<T extends object>() {
  return <const Names extends readonly (keyof T & string)[]>(
    names: Names & ([MissingNames<T, Names>] extends [never] ? unknown : { readonly missingOptionNames: MissingNames<T, Names> }),
  ): Names => names;
}

/**
 * Throws a {@link ValidationError} (`INVALID_OPTIONS`) for the first own property of `options`
 * that is not in `known`, naming `where` it was passed and the closest known name. Anything
 * that is not a plain object is left to the caller's own checks.
 */
export function refuseUnknownOptions(options: unknown, known: readonly string[], where: string): void {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) return;
  for (const name of Object.keys(options)) {
    if (known.includes(name)) continue;
    const closest = closestName(name, known);
    const hint = closest === undefined ? '' : ` Did you mean "${closest}"?`;
    throw new ValidationError(
      'INVALID_OPTIONS',
      name,
      `${where}: unknown option "${name}".${hint} Known options: ${[...known].sort().join(', ')}.`,
    );
  }
}

/**
 * Throws a {@link ValidationError} (`INVALID_OPTIONS`) when `value` is set and is not one of
 * `valid`, listing the valid values and the closest one.
 */
export function refuseUnknownValue(value: unknown, valid: readonly string[], option: string, where: string): void {
  if (value === undefined || valid.includes(value as string)) return;
  const closest = typeof value === 'string' ? closestName(value, valid) : undefined;
  const hint = closest === undefined ? '' : ` Did you mean "${closest}"?`;
  throw new ValidationError(
    'INVALID_OPTIONS',
    option,
    `${where}: ${option} ${JSON.stringify(value) ?? String(value)} is not one of ${valid.map((v) => `"${v}"`).join(', ')}.${hint}`,
  );
}

/**
 * The known name nearest `name` by edit distance (letter case ignored, so `leaseMS` finds
 * `leaseMs`), when it is near enough to be a slip: at most a third of the name's length, and
 * at least two edits.
 */
export function closestName(name: string, known: readonly string[]): string | undefined {
  const limit = Math.max(2, Math.floor(name.length / 3));
  let best: { name: string; distance: number } | undefined;
  for (const candidate of known) {
    const distance = editDistance(name.toLowerCase(), candidate.toLowerCase());
    if (distance <= limit && (best === undefined || distance < best.distance)) best = { name: candidate, distance };
  }
  return best?.name;
}

/** Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours. */
export function editDistance(a: string, b: string): number {
  const rows: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) rows[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, rows[i - 2]![j - 2]! + 1);
      rows[i]![j] = best;
    }
  }
  return rows[a.length]![b.length]!;
}
