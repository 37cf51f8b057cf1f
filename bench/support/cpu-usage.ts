/**
 * CPU time spent while a drain runs, from Linux's /proc (clock ticks, see proc-stat.ts): the whole
 * machine's busy time, and the time of the Postgres and Redis server processes. Together with
 * the worker's own `process.cpuUsage()`, it says where a job's CPU goes, which stays comparable
 * when the machine's speed drifts and jobs/s does not. Elsewhere than Linux, all are undefined.
 */
import { readFileSync } from 'node:fs';
import { readAllProcStats, ticksBetween, ticksToMs, type ProcStat } from './proc-stat.js';

/** A snapshot; subtract two with {@link cpuSince}. */
export interface CpuSnapshot {
  readonly machineBusyTicks: number;
  readonly byProcess: ReadonlyMap<number, ProcStat>;
}

/** CPU milliseconds between a snapshot and now. */
export interface CpuSpent {
  readonly machineMs: number;
  readonly postgresMs: number;
  readonly redisMs: number;
}

const SERVER_NAMES = new Set(['postgres', 'redis-server']);

/** The whole machine's busy time so far, in clock ticks (`/proc/stat`), or undefined elsewhere than Linux. */
export function machineBusyTicks(): number | undefined {
  try {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    return fields.slice(0, 8).reduce((a, b) => a + b, 0) - fields[3]! - fields[4]!;
  } catch {
    return undefined;
  }
}

export function cpuSnapshot(): CpuSnapshot | undefined {
  const machine = machineBusyTicks();
  if (machine === undefined) return undefined;
  const byProcess = new Map([...readAllProcStats()].filter(([, stat]) => SERVER_NAMES.has(stat.comm)));
  return { machineBusyTicks: machine, byProcess };
}

/** CPU spent since `before` (processes that ended in between are missed; new ones count whole). */
export function cpuSince(before: CpuSnapshot | undefined): CpuSpent | undefined {
  const now = cpuSnapshot();
  if (!before || !now) return undefined;
  const spent = (comm: string) => {
    let ticks = 0;
    for (const [pid, stat] of now.byProcess) if (stat.comm === comm) ticks += ticksBetween(before.byProcess.get(pid), stat);
    return ticksToMs(ticks);
  };
  return { machineMs: ticksToMs(now.machineBusyTicks - before.machineBusyTicks), postgresMs: spent('postgres'), redisMs: spent('redis-server') };
}
