/**
 * CPU time spent while a drain runs, from Linux's /proc (clock ticks, 10 ms each): the whole
 * machine's busy time, and the time of the Postgres and Redis server processes. Together with
 * the worker's own `process.cpuUsage()`, it says where a job's CPU goes, which stays comparable
 * when the machine's speed drifts and jobs/s does not. Elsewhere than Linux, all are undefined.
 */
import { readdirSync, readFileSync } from 'node:fs';

const MS_PER_TICK = 10;

/** A snapshot; subtract two with {@link cpuSince}. */
export interface CpuSnapshot {
  readonly machineBusyTicks: number;
  readonly byProcess: ReadonlyMap<number, { readonly comm: string; readonly ticks: number }>;
}

/** CPU milliseconds between a snapshot and now. */
export interface CpuSpent {
  readonly machineMs: number;
  readonly postgresMs: number;
  readonly redisMs: number;
}

export function cpuSnapshot(): CpuSnapshot | undefined {
  try {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    const machineBusyTicks = fields.slice(0, 8).reduce((a, b) => a + b, 0) - fields[3]! - fields[4]!;
    const byProcess = new Map<number, { comm: string; ticks: number }>();
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
        const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
        if (comm !== 'postgres' && comm !== 'redis-server') continue;
        const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        byProcess.set(Number(entry), { comm, ticks: Number(rest[11]) + Number(rest[12]) }); // utime + stime
      } catch {
        // the process ended while we looked
      }
    }
    return { machineBusyTicks, byProcess };
  } catch {
    return undefined;
  }
}

/** CPU spent since `before` (processes that ended in between are missed; new ones count whole). */
export function cpuSince(before: CpuSnapshot | undefined): CpuSpent | undefined {
  const now = cpuSnapshot();
  if (!before || !now) return undefined;
  const spent = (comm: string) => {
    let ticks = 0;
    for (const [pid, p] of now.byProcess) if (p.comm === comm) ticks += p.ticks - (before.byProcess.get(pid)?.ticks ?? 0);
    return ticks * MS_PER_TICK;
  };
  return { machineMs: (now.machineBusyTicks - before.machineBusyTicks) * MS_PER_TICK, postgresMs: spent('postgres'), redisMs: spent('redis-server') };
}
