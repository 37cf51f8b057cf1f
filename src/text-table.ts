/** Formats rows as a left-aligned text table for people (`--json` is for scripts). */
export function formatTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((row) => (row[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, i) => (i === cells.length - 1 ? cell : cell.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)].join('\n');
}

/** A timestamp for a table cell: ISO 8601 to the second, or `-`. */
export function formatTime(date: Date | null | undefined): string {
  return date ? date.toISOString().replace(/\.\d{3}Z$/, 'Z') : '-';
}

/** A duration for people: `3d 4h`, `2h 5m`, `41s`, `250ms`. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const units: Array<[string, number]> = [['d', 86_400_000], ['h', 3_600_000], ['m', 60_000], ['s', 1000]];
  const parts: string[] = [];
  let rest = ms;
  for (const [unit, size] of units) {
    const n = Math.floor(rest / size);
    if (n > 0 || parts.length > 0) parts.push(`${n}${unit}`);
    rest -= n * size;
    if (parts.length === 2) break;
  }
  return parts.filter((p) => !p.startsWith('0')).join(' ') || '0s';
}
