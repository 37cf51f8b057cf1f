/**
 * The benchmark's reading of /proc/<pid>/stat (bench/support/proc-stat.ts), which its CPU per job
 * rests on: the fields after a process name holding spaces and parentheses, a real read of this
 * process, and a reused pid counted as the new process it is.
 */
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { cpuPerThousandJobs } from '../bench/support/drain-cpu.js';
import { clockTicksPerSecond, parseProcStat, readProcStat, ticksBetween, ticksToMs } from '../bench/support/proc-stat.js';

// A line as the kernel writes it, for a process named "a) (b c", pid 4242, parent 17, utime 1234, stime 56, started at tick 987654.
const LINE =
  '4242 (a) (b c) S 17 4242 4242 0 -1 4194560 1000 0 0 0 1234 56 0 0 20 0 11 0 987654 1262854144 24681 18446744073709551615 1 1 0 0 0 0 0 4096 134234626 0 0 0 17 1 0 0 0 0 0\n';

describe('parseProcStat', () => {
  it('counts the fields after the last parenthesis, so a name with spaces and parentheses does not shift them', () => {
    expect(parseProcStat(LINE)).toEqual({ pid: 4242, comm: 'a) (b c', ppid: 17, utimeTicks: 1234, stimeTicks: 56, startTimeTicks: 987654 });
  });

  it('refuses a line that is not a stat line, saying what it got', () => {
    expect(() => parseProcStat('no name here')).toThrow(/not a \/proc\/<pid>\/stat line: "no name here"/);
    expect(() => parseProcStat('12 (node) S 1 2')).toThrow(/without a numeric field 14/);
  });

  it('reads this process from /proc/self/stat, and its user + system time grows as it spends CPU', () => {
    const before = readProcStat(process.pid);
    expect(before).toMatchObject({ pid: process.pid, ppid: process.ppid });
    // Spend at least 100 ms of CPU (process.cpuUsage reads the same counters as /proc).
    const start = process.cpuUsage();
    let spent = 0;
    while (spent < 100_000) {
      const usage = process.cpuUsage(start);
      spent = usage.user + usage.system;
    }
    const after = readProcStat(process.pid)!;
    expect(after.startTimeTicks).toBe(before!.startTimeTicks);
    expect(ticksToMs(ticksBetween(before, after))).toBeGreaterThanOrEqual(50);
  });

  it('gives undefined for a process that does not exist', () => {
    expect(readProcStat(2 ** 31 - 1)).toBeUndefined();
  });
});

describe('ticksBetween', () => {
  const at = (utimeTicks: number, stimeTicks: number, startTimeTicks = 100) => ({ ...parseProcStat(LINE), utimeTicks, stimeTicks, startTimeTicks });

  it('is the growth of user + system time of the same process', () => {
    expect(ticksBetween(at(10, 5), at(40, 7))).toBe(32);
  });

  it('counts a process whole when it started after the first reading, or when its pid belonged to another process then', () => {
    expect(ticksBetween(undefined, at(40, 7))).toBe(47);
    expect(ticksBetween(at(500, 500, 100), at(40, 7, 900))).toBe(47);
  });
});

it('converts ticks at the rate getconf CLK_TCK gives', () => {
  const perSecond = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
  expect(clockTicksPerSecond()).toBe(perSecond);
  expect(ticksToMs(perSecond * 3)).toBe(3000);
});

describe('cpuPerThousandJobs', () => {
  it('divides each part by the jobs and sums what was measured', () => {
    const cpu = { workerMs: 600, workerProcesses: 1, postgresMs: 900, postgresBackends: 34, postgresAllMs: 1200, redisMs: 300, machineMs: 2500 };
    expect(cpuPerThousandJobs(cpu, 3000)).toEqual({ total: 600, node: 200, postgres: 300, redis: 100 });
  });

  it('leaves a part that was not measured out of the sum (no Redis on the Postgres queue backend)', () => {
    const cpu = { workerMs: 600, workerProcesses: 1, postgresMs: 900, postgresBackends: 34, postgresAllMs: 1200, redisMs: undefined, machineMs: 2500 };
    expect(cpuPerThousandJobs(cpu, 3000)).toEqual({ total: 500, node: 200, postgres: 300, redis: undefined });
  });
});
