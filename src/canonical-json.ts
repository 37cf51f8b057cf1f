/**
 * RFC 8785 (JSON Canonicalization Scheme) serialisation: object keys sorted by UTF-16 code
 * units, numbers and strings as ECMAScript's `JSON.stringify` spells them (which is what the
 * RFC specifies). Part of the library rather than a dependency so that every way of loading
 * it works: the `canonicalize` package exports only an `import` condition, which a TypeScript
 * runner's CommonJS transform (tsx in a CommonJS project) cannot `require`.
 *
 * Callers check the value first ({@link findJsonProblem} in `json-limits.ts`): non-finite
 * numbers, lone surrogates, BigInts, cycles and excessive depth are refused there with a
 * pointer to the offending value, so this function only serialises.
 */

/**
 * The canonical JSON text of `value`. As with `JSON.stringify`, `toJSON` is honoured (a Date
 * becomes its ISO string), and `undefined`, functions and symbols are dropped from objects and
 * become `null` in arrays; a top-level value with no JSON spelling gives `undefined`.
 */
export function canonicalJson(value: unknown): string | undefined {
  const current = withToJson(value);
  if (current === null || typeof current !== 'object') return JSON.stringify(current) as string | undefined;
  if (Array.isArray(current)) {
    return `[${current.map((item: unknown) => (dropped(withToJson(item)) ? 'null' : canonicalJson(item))).join(',')}]`;
  }
  const record = current as Record<string, unknown>;
  const members: string[] = [];
  // The default sort compares UTF-16 code units, the order RFC 8785 prescribes.
  for (const key of Object.keys(record).sort()) {
    const member = withToJson(record[key]);
    if (dropped(member)) continue;
    members.push(`${JSON.stringify(key)}:${canonicalJson(member)}`);
  }
  return `{${members.join(',')}}`;
}

function withToJson(value: unknown): unknown {
  if (value !== null && typeof value === 'object' && typeof (value as { toJSON?: unknown }).toJSON === 'function') {
    return (value as { toJSON: () => unknown }).toJSON();
  }
  return value;
}

/** Values JSON has no spelling for: left out of an object, `null` in an array. */
function dropped(value: unknown): boolean {
  return value === undefined || typeof value === 'symbol' || typeof value === 'function';
}
