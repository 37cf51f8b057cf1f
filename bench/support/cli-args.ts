/**
 * Reading `--name value` options of the benchmark scripts. Each option read is taken out of
 * `argv`, so that what is left is the positional arguments (or a mistake to report).
 */
export function optionReader(argv: string[]) {
  const value = (name: string): string | undefined => {
    const i = argv.indexOf(name);
    if (i < 0) return undefined;
    const v = argv[i + 1];
    if (v === undefined || v.startsWith('--')) throw new Error(`${name} needs a value`);
    argv.splice(i, 2);
    return v;
  };
  const positive = (name: string, fallback: number): number => {
    const raw = value(name);
    if (raw === undefined) return fallback;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer (got ${JSON.stringify(raw)})`);
    return n;
  };
  return { value, positive };
}
