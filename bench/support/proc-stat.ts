/**
 * A process's CPU time as Linux reports it in `/proc/<pid>/stat`: user and system time in clock
 * ticks (`getconf CLK_TCK`, 100 a second on nearly every Linux). The benchmark reads it before
 * and after a drain for every process involved (worker, Postgres backends, Redis), so its own
 * process and the machine's other load stay out of a contender's CPU per job.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

/** The fields of one `/proc/<pid>/stat` line the benchmark uses. */
export interface ProcStat {
  readonly pid: number;
  /** The executable's name as the kernel keeps it (at most 15 characters), e.g. `node`, `postgres`. */
  readonly comm: string;
  readonly ppid: number;
  /** Time in user mode (field 14), clock ticks. */
  readonly utimeTicks: number;
  /** Time in kernel mode (field 15), clock ticks. */
  readonly stimeTicks: number;
  /** When the process started after boot (field 22), clock ticks: tells a reused pid from the process it had before. */
  readonly startTimeTicks: number;
}

/**
 * Parses one `/proc/<pid>/stat` line. The name (field 2) is in parentheses and may itself hold
 * spaces and parentheses, so the fields after it are counted from its last `)`.
 */
export function parseProcStat(line: string): ProcStat {
  const open = line.indexOf('(');
  const close = line.lastIndexOf(')');
  if (open < 0 || close < open) throw new Error(`not a /proc/<pid>/stat line: ${JSON.stringify(line.slice(0, 80))}`);
  // After the name: field 3 (state) is at index 0, so field k is at index k - 3.
  const rest = line.slice(close + 2).trim().split(/\s+/);
  const field = (k: number) => {
    const value = Number(rest[k - 3]);
    if (!Number.isFinite(value)) throw new Error(`/proc/<pid>/stat line without a numeric field ${k}: ${JSON.stringify(line.slice(0, 80))}`);
    return value;
  };
  return {
    pid: Number(line.slice(0, open).trim()),
    comm: line.slice(open + 1, close),
    ppid: field(4),
    utimeTicks: field(14),
    stimeTicks: field(15),
    startTimeTicks: field(22),
  };
}

/** `/proc/<pid>/stat` of one process, or undefined once it has gone (or elsewhere than Linux). */
export function readProcStat(pid: number): ProcStat | undefined {
  try {
    return parseProcStat(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return undefined;
  }
}

/** Every process's `/proc/<pid>/stat` at this moment (those that end while it looks are left out). */
export function readAllProcStats(): Map<number, ProcStat> {
  const all = new Map<number, ProcStat>();
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return all;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = readProcStat(Number(entry));
    if (stat) all.set(stat.pid, stat);
  }
  return all;
}

let ticksPerSecond: number | undefined;

/** Clock ticks a second (`getconf CLK_TCK`), looked up once; 100, Linux's usual value, if getconf fails. */
export function clockTicksPerSecond(): number {
  if (ticksPerSecond === undefined) {
    try {
      const value = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
      ticksPerSecond = Number.isInteger(value) && value > 0 ? value : 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

/** Clock ticks as milliseconds. */
export function ticksToMs(ticks: number): number {
  return (ticks * 1000) / clockTicksPerSecond();
}

/**
 * CPU ticks a process spent between two readings: `after`'s user + system time less `before`'s,
 * or all of `after`'s when `before` is missing or belonged to another process that had the pid.
 */
export function ticksBetween(before: ProcStat | undefined, after: ProcStat): number {
  const total = (s: ProcStat) => s.utimeTicks + s.stimeTicks;
  return before && before.startTimeTicks === after.startTimeTicks ? total(after) - total(before) : total(after);
}
