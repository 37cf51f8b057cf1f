import type { Command } from 'commander';
import { Schedules, type ScheduleInfo } from '../ops/schedules.js';
import { formatDuration, formatTable, formatTime } from '../text-table.js';
import { EXIT_NOT_FOUND } from '../runtime/exit-codes.js';
import { withDatabase } from './with-database.js';

/**
 * `schedules list|get|remove`: each schedule with its spec, missed-ticks policy, queue, last and
 * next tick; one of them; removing one. Exit codes: see `exit-codes.ts` (a name that is not a
 * schedule's: `EXIT_NOT_FOUND`; a name no schedule could have: `EXIT_USAGE`).
 */
export function registerSchedulesCommand(program: Command): void {
  const schedules = program.command('schedules').description('schedules whose every tick runs exactly once (see docs/guide.md#schedules)');
  schedules
    .command('list')
    .description('each schedule: its cron expression or interval, missed-ticks policy, queue, last tick enqueued and next tick')
    .option('--json', 'print the schedules as JSON, one array')
    .action(async (options: { json?: boolean }) => {
      const list = await withDatabase((_, db, schema) => new Schedules({ db, schema }).list());
      if (options.json) {
        console.log(JSON.stringify(list));
        return;
      }
      if (list.length === 0) {
        console.log('No schedules. Add one with Schedules.upsert() (docs/guide.md#schedules).');
        return;
      }
      console.log(
        formatTable(
          ['NAME', 'SPEC', 'MISSED', 'QUEUE', 'LAST TICK', 'NEXT TICK'],
          list.map((s) => [s.name, describeSpec(s), s.missed === 'all' ? `all (max ${s.maxMissed})` : 'latest', s.queue, s.lastTick ? formatTime(s.lastTick) : '-', describeNextTick(s)]),
        ),
      );
    });
  schedules
    .command('get <name>')
    .description('one schedule: its cron expression or interval, time zone, missed-ticks policy, queue, job name, payload, last and next tick')
    .option('--json', 'print the schedule as JSON')
    .action(async (name: string, options: { json?: boolean }) => {
      const schedule = await withDatabase((_, db, schema) => new Schedules({ db, schema }).get(name));
      if (!schedule) return notFound(name, options.json);
      if (options.json) {
        console.log(JSON.stringify(schedule));
        return;
      }
      const rows: Array<[string, string]> = [
        ['name', schedule.name],
        ['spec', describeSpec(schedule)],
        ['missed ticks', schedule.missed === 'all' ? `all (max ${schedule.maxMissed})` : 'latest'],
        ['queue', schedule.queue],
        ['job name', schedule.jobName],
        ['payload', JSON.stringify(schedule.data)],
        ['last tick', schedule.lastTick ? formatTime(schedule.lastTick) : '-'],
        ['next tick', schedule.nextTick ? formatTime(schedule.nextTick) : 'none'],
        ...(showsLocalTime(schedule) && schedule.nextTickLocal ? [['next tick, local', localPart(schedule, 'date')] as [string, string]] : []),
      ];
      const width = Math.max(...rows.map(([field]) => field.length));
      console.log(rows.map(([field, value]) => `${field.padEnd(width)}  ${value}`).join('\n'));
    });
  schedules
    .command('remove <name>')
    .description('remove a schedule: no scheduler enqueues its ticks from the next round on; adding it again later never repeats a tick it had enqueued')
    .action(async (name: string) => {
      const removed = await withDatabase((_, db, schema) => new Schedules({ db, schema }).remove(name));
      if (!removed) return notFound(name, false);
      console.log(`Removed schedule "${name}". Ticks already enqueued still run; adding it again starts after the ticks it had enqueued.`);
    });
}

function notFound(name: string, json: boolean | undefined): void {
  if (json) console.log(JSON.stringify({ found: false, name }));
  console.error(`No schedule "${name}" (see \`idempotent-jobs schedules list\`).`);
  process.exitCode = EXIT_NOT_FOUND;
}

/** Whether the schedule's ticks are read on a clock other than UTC's (a cron expression in another zone). */
function showsLocalTime(schedule: ScheduleInfo): boolean {
  return schedule.kind === 'cron' && schedule.timezone !== 'UTC';
}

/**
 * The next tick as the scheduler will enqueue it, and for a cron expression in another zone its
 * local time: `2026-03-29T01:00:00Z (03:00+02:00 local, for 02:00 skipped)` when it stands for a
 * fixed time the clock skips (docs/guide.md#schedules, "Clock changes").
 */
function describeNextTick(schedule: ScheduleInfo): string {
  if (!schedule.nextTick) return 'none';
  return showsLocalTime(schedule) && schedule.nextTickLocal ? `${formatTime(schedule.nextTick)} (${localPart(schedule)})` : formatTime(schedule.nextTick);
}

/**
 * `03:00+02:00 local` (with `'date'`: `2026-03-29T03:00:00+02:00`), then `, for 02:00 skipped`
 * when the tick stands for a time the clock skips.
 */
function localPart(schedule: ScheduleInfo, withDate?: 'date'): string {
  const local = schedule.nextTickLocal!;
  const clock = withDate ? local : `${shortTime(local.slice(11, 19))}${local.slice(19)} local`;
  const skipped = schedule.nextTickSkippedLocalTime;
  return skipped ? `${clock}, for ${shortTime(skipped.slice(11, 19))} skipped` : clock;
}

/** `03:00:00` → `03:00`; `03:00:20` stays. */
function shortTime(time: string): string {
  return time.endsWith(':00') ? time.slice(0, 5) : time;
}

/** `0 2 * * * (Europe/Paris)` or `every 1m`. */
function describeSpec(schedule: ScheduleInfo): string {
  if (schedule.kind === 'interval') return `every ${formatDuration(Number(schedule.spec))}`;
  return schedule.timezone === 'UTC' ? schedule.spec : `${schedule.spec} (${schedule.timezone})`;
}
