/**
 * The PromQL the shipped dashboard and alerts run, and the metric names it reads: what
 * `test/dashboard-alerts.test.ts` checks against a real scrape.
 */
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';

export const DASHBOARD_PATH = 'deploy/grafana/idempotent-jobs.json';
export const ALERTS_PATH = 'deploy/prometheus/alerts.yml';

/** One PromQL expression and where it comes from (for failure messages). */
export interface Query {
  readonly source: string;
  readonly expr: string;
}

/** One alerting rule as the rules file states it. */
export interface AlertRule {
  readonly alert: string;
  readonly expr: string;
  readonly annotations?: Record<string, string>;
}

/** A Grafana panel, as far as these checks read it. */
export interface Panel {
  readonly id: number;
  readonly type: string;
  readonly title: string;
  readonly datasource?: { readonly uid?: string };
  readonly targets?: ReadonlyArray<{ readonly expr?: string; readonly refId?: string }>;
  readonly gridPos?: { readonly h: number; readonly w: number; readonly x: number; readonly y: number };
}

export interface Dashboard {
  readonly uid: string;
  readonly panels: readonly Panel[];
  readonly templating: { readonly list: ReadonlyArray<{ readonly name: string; readonly type: string; readonly definition?: string }> };
}

export function loadDashboard(path = DASHBOARD_PATH): Dashboard {
  return JSON.parse(readFileSync(path, 'utf8')) as Dashboard;
}

export function loadAlertRules(path = ALERTS_PATH): AlertRule[] {
  const file = parse(readFileSync(path, 'utf8')) as { groups: Array<{ rules: AlertRule[] }> };
  return file.groups.flatMap((group) => group.rules);
}

/** Every panel query of the dashboard, and its template variables' `label_values(metric, label)` queries. */
export function dashboardQueries(dashboard: Dashboard): Query[] {
  const queries: Query[] = [];
  for (const panel of dashboard.panels) {
    for (const target of panel.targets ?? []) {
      if (target.expr !== undefined) queries.push({ source: `panel "${panel.title}" (${target.refId})`, expr: target.expr });
    }
  }
  for (const variable of dashboard.templating.list) {
    const metric = /^label_values\(\s*([A-Za-z_:][\w:]*)\s*,/.exec(variable.definition ?? '')?.[1];
    if (metric !== undefined) queries.push({ source: `variable $${variable.name}`, expr: metric });
  }
  return queries;
}

export function alertQueries(rules: readonly AlertRule[]): Query[] {
  return rules.map((rule) => ({ source: `alert ${rule.alert}`, expr: rule.expr }));
}

// PromQL words that look like names but are not metrics.
const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'atan2', 'inf', 'nan', 'group_left', 'group_right', 'on', 'ignoring', 'by', 'without']);

/**
 * The metric names a PromQL expression selects. Strings, label matchers, ranges, grouping
 * clauses, Grafana variables and numbers are removed first; what is left that names no
 * function (an identifier followed by `(`) and no keyword is a metric. `{__name__=…}`
 * selectors are refused rather than missed.
 */
export function metricNamesIn(expr: string): string[] {
  if (expr.includes('__name__')) throw new Error(`selecting by __name__ is not supported by this check: ${expr}`);
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\boffset\s+\S+/g, ' ')
    .replace(/\$\{?\w+\}?/g, ' ')
    .replace(/(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g, ' ');
  const names = new Set<string>();
  for (const match of bare.matchAll(/[A-Za-z_:][\w:]*/g)) {
    const after = bare.slice(match.index + match[0].length);
    if (/^\s*\(/.test(after) || KEYWORDS.has(match[0].toLowerCase())) continue;
    names.add(match[0]);
  }
  return [...names];
}

/** The names of the samples in a Prometheus text exposition (a histogram's `_bucket`, `_sum`, `_count`). */
export function sampleNames(exposition: string): Set<string> {
  const names = new Set<string>();
  for (const line of exposition.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    names.add(/^[A-Za-z_:][\w:]*/.exec(line)![0]);
  }
  return names;
}

/** Queries that read a metric no scrape exported: `[source, metric]` pairs, empty when all are there. */
export function unexportedMetrics(queries: readonly Query[], exported: ReadonlySet<string>): Array<[string, string]> {
  const missing: Array<[string, string]> = [];
  for (const query of queries) {
    for (const name of metricNamesIn(query.expr)) if (!exported.has(name)) missing.push([query.source, name]);
  }
  return missing;
}
