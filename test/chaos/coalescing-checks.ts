/**
 * The checker rules of the coalescing profile (`--coalescing`, see `key-feature-checks.ts` for
 * the others): a pure function over the runs, key rows and log lines a run left.
 */
import { STORE_FAULT_LOG_MESSAGE } from './fault-injection.js';
import { groupBy, idOf, result, type KeyFeatureCheck } from './key-feature-checks.js';
import type { WorkerLogLine } from './worker-fleet.js';

/** One committed run of a coalescing key's generation. */
export interface GenerationRun {
  /** `scope/key` of the coalescing key (without the generation). */
  readonly id: string;
  readonly generation: number;
  /** The payload's version (the producer numbers a key's adds 1, 2, … in the order it sends them). */
  readonly version: number;
  /** Its external call (the run's start) and its effect's insert (its end), database clock. */
  readonly start: number | undefined;
  readonly end: number;
}

/** What {@link checkCoalescing} reads. */
export interface CoalescingHistory {
  /** Per coalescing key (`scope/key`): the versions acknowledged, in the order sent. */
  readonly sent: ReadonlyMap<string, readonly number[]>;
  /** Every committed generation run. */
  readonly runs: readonly GenerationRun[];
  /** Per coalescing key, the generations that have a key row (`<key>#<generation>`), any status. */
  readonly generations: ReadonlyMap<string, readonly number[]>;
  /** The version each job id carried (the producer's job ids). */
  readonly versionOfJob: ReadonlyMap<string, number>;
  readonly lines: readonly WorkerLogLine[];
  /**
   * Per coalescing key, per version: when it counts as sent (ms), by the database's rule: its
   * producer's stamp, or, for a stamp ahead of the database's clock, the time its first arrival
   * was given (`coalescing_arrivals`). Unset: the versions' order.
   */
  readonly sentAt?: ReadonlyMap<string, ReadonlyMap<number, number>>;
  /** Per job id, how far the clock that stamped it was off (ms; positive: ahead). Unset: none was. */
  readonly skewOfJob?: ReadonlyMap<string, number>;
}

/**
 * Coalescing under bursts, skewed producer clocks and store faults at the hand-over: each
 * generation of a key committed exactly once (generations 1 … n, none without its effect, none
 * twice); no payload run in two generations; the runs of one key one after another; the payload
 * sent last (by the send times the database orders by: {@link CoalescingHistory.sentAt}) is the one
 * that ran last; and at most one pending successor, the newest: a generation never runs a payload
 * when a newer one (sent later) had arrived before the previous generation ended (arrivals from
 * their `coalesced` log lines; only arrivals logged at least `toleranceMs` before that end count,
 * so clocks a few ms apart cannot fail the rule).
 */
export function checkCoalescing(history: CoalescingHistory, toleranceMs = 50): KeyFeatureCheck {
  const runsByKey = groupBy(history.runs, (run) => run.id);
  const notOnce: string[] = [];
  const ranTwice: string[] = [];
  const lastNotLast: string[] = [];
  const overlapping: string[] = [];
  const superseded: string[] = [];
  const arrivals = groupBy(
    history.lines.filter((line) => line.outcome === 'coalesced' && line.jobId !== undefined && history.versionOfJob.has(line.jobId)),
    idOf,
  );
  let generationsRun = 0;
  for (const [id, versions] of history.sent) {
    if (versions.length === 0) continue;
    const sentAt = (version: number) => history.sentAt?.get(id)?.get(version) ?? version;
    const runs = [...(runsByKey.get(id) ?? [])].sort((a, b) => a.generation - b.generation);
    const byGeneration = groupBy(runs, (run) => String(run.generation));
    const highest = Math.max(0, ...runs.map((r) => r.generation), ...(history.generations.get(id) ?? []));
    generationsRun += byGeneration.size;
    for (let generation = 1; generation <= highest; generation++) {
      const count = byGeneration.get(String(generation))?.length ?? 0;
      if (count !== 1) notOnce.push(`${id}#${generation}: ${count} effects`);
    }
    for (const [version, list] of groupBy(runs, (run) => String(run.version))) {
      const inGenerations = new Set(list.map((run) => run.generation));
      if (inGenerations.size > 1) ranTwice.push(`${id}: version ${version} ran in generations ${[...inGenerations].join(', ')}`);
    }
    const last = runs.at(-1);
    const newestAt = Math.max(...versions.map(sentAt));
    if (!last || sentAt(last.version) !== newestAt) {
      const newest = versions.filter((v) => sentAt(v) === newestAt).join(' or ');
      lastNotLast.push(`${id}: newest sent ${newest}, ran last ${last?.version ?? 'nothing'}`);
    }
    const keyArrivals = (arrivals.get(id) ?? []).map((line) => ({ at: line.time, version: history.versionOfJob.get(line.jobId!)! })).sort((a, b) => a.at - b.at);
    for (let i = 1; i < runs.length; i++) {
      const previous = runs[i - 1]!;
      const run = runs[i]!;
      if (run.generation !== previous.generation + 1) continue;
      if (run.start !== undefined && run.start < previous.end) overlapping.push(`${id}#${run.generation} started before #${previous.generation} ended`);
      // Coalesced arrivals before the previous run ended: the newest sent of them is the pending
      // one the next generation takes; a run of an older one means a queue of successors, or an
      // older payload that replaced a newer one.
      const before = keyArrivals.filter((a) => a.at < previous.end - toleranceMs);
      const newest = before.reduce<number | undefined>((best, a) => (best === undefined || sentAt(a.version) > sentAt(best) ? a.version : best), undefined);
      if (newest !== undefined && before.some((a) => a.version === run.version) && sentAt(newest) > sentAt(run.version)) {
        superseded.push(`${id}#${run.generation} ran version ${run.version}, replaced by ${newest} before #${previous.generation} ended`);
      }
    }
  }
  const adds = [...history.sent.values()].reduce((sum, v) => sum + v.length, 0);
  const coalesced = [...arrivals.values()].reduce((sum, list) => sum + list.length, 0);
  const skews = [...(history.skewOfJob?.values() ?? [])];
  const storeFaults = history.lines.filter((line) => line.msg === STORE_FAULT_LOG_MESSAGE);
  const faultsAt = (point: string) => storeFaults.filter((line) => line.point === point).length;
  const numbers: Array<readonly [string, string]> = [['coalescing keys: acknowledged adds / generations run / arrivals coalesced', `${history.sent.size}: ${adds} / ${generationsRun} / ${coalesced}`]];
  const rules = [
    { rule: 'generations not committed exactly once', failing: notOnce },
    { rule: 'payloads run in more than one generation', failing: ranTwice },
    { rule: 'keys whose newest payload sent did not run last', failing: lastNotLast },
    { rule: 'runs of one key overlapping', failing: overlapping },
    { rule: 'generations that ran a replaced payload (more than one pending successor)', failing: superseded },
    { rule: 'no arrival coalesced (nothing tested)', failing: coalesced === 0 ? ['0 coalesced'] : [] },
  ];
  if (history.skewOfJob) {
    const ahead = skews.filter((skew) => skew > 0).length;
    const behind = skews.filter((skew) => skew < 0).length;
    numbers.push(['adds stamped by a producer clock ahead / behind / right', `${ahead} / ${behind} / ${skews.length - ahead - behind}`]);
    numbers.push(['store faults injected at the hand-over: before / after it reached Postgres', `${faultsAt('before-hand-over')} / ${faultsAt('after-hand-over')}`]);
    rules.push({
      rule: 'no add stamped by a clock ahead or behind, or no store fault at the hand-over (nothing tested)',
      failing: ahead === 0 || behind === 0 || storeFaults.length === 0 ? [`${ahead} ahead, ${behind} behind, ${storeFaults.length} store faults`] : [],
    });
  }
  return result('coalescing', numbers, rules);
}
