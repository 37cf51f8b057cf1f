/** Hand-rolled SVG: throughput against duplicate ratio, and recovery time against lease. */

/** One line of the throughput panel: median jobs/s at each duplicate ratio, with min–max. */
export interface ThroughputSeries {
  readonly label: string;
  readonly color: string;
  readonly points: ReadonlyArray<{ ratio: number; median: number; min: number; max: number }>;
}

/** One recovery measurement per lease: median with min–max. */
export interface RecoveryPoint {
  readonly leaseMs: number;
  readonly median: number;
  readonly min: number;
  readonly max: number;
}

/** What the chart shows. */
export interface ChartData {
  readonly title: string;
  readonly throughput: readonly ThroughputSeries[];
  /** Horizontal reference lines (e.g. the at-least-once baseline), jobs/s. */
  readonly baselines: ReadonlyArray<{ label: string; color: string; value: number }>;
  readonly recovery: readonly RecoveryPoint[];
}

const W = 460;
const H = 320;
const M = { left: 64, right: 16, top: 40, bottom: 48 };

/** Renders both panels side by side as one SVG document. */
export function renderChart(data: ChartData): string {
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W * 2 + 20}" height="${H + 40}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect width="100%" height="100%" fill="white"/>`);
  parts.push(`<text x="${W + 10}" y="20" text-anchor="middle" font-size="14" font-weight="bold">${escape(data.title)}</text>`);
  parts.push(`<g transform="translate(0,30)">${throughputPanel(data)}</g>`);
  parts.push(`<g transform="translate(${W + 20},30)">${recoveryPanel(data.recovery)}</g>`);
  parts.push('</svg>');
  return parts.join('\n');
}

function throughputPanel(data: ChartData): string {
  const ratios = [0, 0.5, 0.9];
  const values = [...data.throughput.flatMap((s) => s.points.map((p) => p.max)), ...data.baselines.map((b) => b.value)];
  const yMax = niceCeil(Math.max(1, ...values.filter(Number.isFinite)));
  const x = (ratio: number) => M.left + (ratio / 1) * (W - M.left - M.right);
  const y = (v: number) => H - M.bottom - (v / yMax) * (H - M.top - M.bottom);
  const out: string[] = [axes('duplicate share of jobs', 'jobs/s (median, min–max)', 'Throughput vs duplicate ratio')];
  for (const r of ratios) out.push(`<text x="${x(r)}" y="${H - M.bottom + 16}" text-anchor="middle">${Math.round(r * 100)}%</text>`);
  out.push(...yTicks(yMax, y));
  data.baselines.forEach((b, i) => {
    out.push(`<line x1="${M.left}" x2="${W - M.right}" y1="${y(b.value)}" y2="${y(b.value)}" stroke="${b.color}" stroke-dasharray="5,4"/>`);
    out.push(`<text x="${W - M.right - 4}" y="${y(b.value) - 4 - i * 0}" text-anchor="end" fill="${b.color}">${escape(b.label)}</text>`);
  });
  data.throughput.forEach((series, i) => {
    const pts = series.points.filter((p) => Number.isFinite(p.median));
    out.push(`<polyline fill="none" stroke="${series.color}" stroke-width="2" points="${pts.map((p) => `${x(p.ratio)},${y(p.median)}`).join(' ')}"/>`);
    for (const p of pts) {
      out.push(`<line x1="${x(p.ratio)}" x2="${x(p.ratio)}" y1="${y(p.min)}" y2="${y(p.max)}" stroke="${series.color}"/>`);
      out.push(`<circle cx="${x(p.ratio)}" cy="${y(p.median)}" r="3.5" fill="${series.color}"/>`);
    }
    out.push(`<rect x="${M.left + 8}" y="${M.top + 4 + i * 16}" width="10" height="10" fill="${series.color}"/>`);
    out.push(`<text x="${M.left + 22}" y="${M.top + 13 + i * 16}">${escape(series.label)}</text>`);
  });
  return out.join('\n');
}

function recoveryPanel(points: readonly RecoveryPoint[]): string {
  const leases = points.map((p) => p.leaseMs);
  const xMax = Math.max(10_000, ...leases) * 1.1;
  const yMax = niceCeil(Math.max(12, ...points.map((p) => p.max / 1000), ...leases.map((l) => l / 1000 + 2)));
  const x = (leaseMs: number) => M.left + (leaseMs / xMax) * (W - M.left - M.right);
  const y = (s: number) => H - M.bottom - (s / yMax) * (H - M.top - M.bottom);
  const out: string[] = [axes('leaseMs (s)', 'recovery after SIGKILL (s)', 'Recovery time vs lease')];
  for (const l of leases) out.push(`<text x="${x(l)}" y="${H - M.bottom + 16}" text-anchor="middle">${l / 1000}</text>`);
  out.push(...yTicks(yMax, y));
  // Target: lease + 2 s.
  out.push(`<line x1="${x(0)}" y1="${y(2)}" x2="${x(xMax)}" y2="${y(xMax / 1000 + 2)}" stroke="#c0392b" stroke-dasharray="5,4"/>`);
  out.push(`<text x="${M.left + 8}" y="${M.top + 13}" fill="#c0392b">target: lease + 2 s</text>`);
  out.push(`<polyline fill="none" stroke="#2471a3" stroke-width="2" points="${points.map((p) => `${x(p.leaseMs)},${y(p.median / 1000)}`).join(' ')}"/>`);
  for (const p of points) {
    out.push(`<line x1="${x(p.leaseMs)}" x2="${x(p.leaseMs)}" y1="${y(p.min / 1000)}" y2="${y(p.max / 1000)}" stroke="#2471a3"/>`);
    out.push(`<circle cx="${x(p.leaseMs)}" cy="${y(p.median / 1000)}" r="3.5" fill="#2471a3"/>`);
  }
  out.push(`<text x="${M.left + 8}" y="${M.top + 29}" fill="#2471a3">measured (median, min–max)</text>`);
  return out.join('\n');
}

function axes(xLabel: string, yLabel: string, title: string): string {
  return [
    `<text x="${W / 2}" y="${M.top - 16}" text-anchor="middle" font-weight="bold">${escape(title)}</text>`,
    `<line x1="${M.left}" y1="${H - M.bottom}" x2="${W - M.right}" y2="${H - M.bottom}" stroke="black"/>`,
    `<line x1="${M.left}" y1="${M.top}" x2="${M.left}" y2="${H - M.bottom}" stroke="black"/>`,
    `<text x="${(M.left + W - M.right) / 2}" y="${H - 12}" text-anchor="middle">${escape(xLabel)}</text>`,
    `<text transform="translate(14,${(M.top + H - M.bottom) / 2}) rotate(-90)" text-anchor="middle">${escape(yLabel)}</text>`,
  ].join('\n');
}

function yTicks(yMax: number, y: (v: number) => number): string[] {
  const out: string[] = [];
  for (let i = 0; i <= 5; i++) {
    const v = (yMax / 5) * i;
    out.push(`<line x1="${M.left - 4}" x2="${W - M.right}" y1="${y(v)}" y2="${y(v)}" stroke="#ddd"/>`);
    out.push(`<text x="${M.left - 8}" y="${y(v) + 4}" text-anchor="end">${Number.isInteger(v) ? v : v.toFixed(1)}</text>`);
  }
  return out;
}

function niceCeil(v: number): number {
  const magnitude = 10 ** Math.floor(Math.log10(v));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * magnitude >= v) return step * magnitude;
  return 10 * magnitude;
}

function escape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}
