import { userInfo } from 'node:os';
import { InvalidArgumentError, type Command } from 'commander';
import { ValidationError } from '../errors.js';
import { stepResultBytes, summarizeStep, type StepSummary } from '../protocol/job-steps.js';
import { MAX_RETENTION_CEILING_MS } from '../protocol/key-retention.js';
import { assertValidKeyPart } from '../protocol/validate.js';
import type { KeyRecord, KeyStatus, StepRecord, TombstoneRecord } from '../store/records.js';
import { EXIT_CONFLICT, EXIT_NOT_FOUND } from '../runtime/exit-codes.js';
import { formatDuration, formatTable, formatTime } from '../text-table.js';
import { withDatabase } from './with-database.js';

const STATUSES: readonly KeyStatus[] = ['processing', 'completed', 'failed'];
const MAX_LIST_LIMIT = 10_000;
const PURGE_BATCH = 1_000;
const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/**
 * Parses a duration such as `30m`, `24h`, `7d` (units ms, s, m, h, d, w) into milliseconds, at
 * most a hundred years (the longest retention a key can have; a longer one reached back before
 * the dates Postgres keeps). Throws commander's `InvalidArgumentError` (exit code 2) on anything else.
 */
export function parseDuration(text: string): number {
  const match = /^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$/.exec(text);
  if (!match) throw new InvalidArgumentError(`"${text}" is not a duration; use a number and a unit: 90s, 30m, 24h, 7d, 2w.`);
  const ms = Number(match[1]) * DURATION_UNITS[match[2]!]!;
  if (!Number.isSafeInteger(ms) || ms <= 0) throw new InvalidArgumentError(`"${text}" must be a positive duration.`);
  if (ms > MAX_RETENTION_CEILING_MS) throw new InvalidArgumentError(`"${text}" is longer than any key is kept: at most ${MAX_RETENTION_CEILING_MS / 604_800_000 | 0}w (a hundred years).`);
  return ms;
}

function parseLimit(text: string): number {
  const n = Number(text);
  if (!/^\d+$/.test(text.trim()) || n < 1 || n > MAX_LIST_LIMIT) {
    throw new InvalidArgumentError(`must be a whole number from 1 to ${MAX_LIST_LIMIT}, got "${text}".`);
  }
  return n;
}

function parseStatus(text: string): KeyStatus {
  if (!(STATUSES as readonly string[]).includes(text)) {
    throw new InvalidArgumentError(`must be one of ${STATUSES.join(', ')}, got "${text}".`);
  }
  return text as KeyStatus;
}

/** Who runs a CLI release, for the key's record: `cli:<login name>`. */
function cliActor(): string {
  let user: string | undefined;
  try {
    user = userInfo().username;
  } catch {
    // No passwd entry for the uid (some containers): the environment may still say.
    user = process.env.USER ?? process.env.LOGNAME;
  }
  return `cli:${user ?? 'unknown'}`;
}

function checkKey(scope: string, key: string): void {
  assertValidKeyPart('scope', scope);
  assertValidKeyPart('key', key);
}

/** A key as JSON for scripts: the record with times in ISO 8601. */
function keyJson(record: KeyRecord): Record<string, unknown> {
  return JSON.parse(JSON.stringify(record)) as Record<string, unknown>;
}

/**
 * A key's steps as JSON for scripts: what was run and recorded under which fence, without the
 * results (their size in bytes instead; null while a step is not recorded).
 */
function stepsJson(steps: readonly StepRecord[]): StepSummary[] {
  return steps.map(summarizeStep);
}

function describeSteps(steps: readonly StepRecord[]): string {
  const recorded = steps.filter((step) => step.recordedAt !== null).length;
  const started = steps.length - recorded;
  return `${steps.length} (${recorded} recorded${started > 0 ? `, ${started} started and not recorded` : ''})`;
}

function stepsTable(steps: readonly StepRecord[]): string {
  return formatTable(
    ['POSITION', 'STEP', 'STARTS', 'FENCE', 'STARTED', 'RECORDED', 'RESULT BYTES'],
    steps.map((step) => {
      const bytes = stepResultBytes(step);
      return [
        String(step.position),
        step.name,
        String(step.starts),
        String(step.fence),
        formatTime(step.startedAt),
        formatTime(step.recordedAt),
        bytes === null ? '-' : String(bytes),
      ];
    }),
  );
}

function describeKey(record: KeyRecord, steps: readonly StepRecord[]): string {
  const rows: Array<[string, string]> = [
    ['scope', record.scope],
    ['key', record.key],
    ['status', record.status],
    ['fence', String(record.fence)],
    ['attempts', String(record.attempts)],
    ['owner', record.owner ?? '-'],
    ['locked until', formatTime(record.lockedUntil)],
    ['job id', record.jobId ?? '-'],
    ['queue', record.queue ?? '-'],
    ['job name', record.jobName ?? '-'],
    ['fingerprint', record.fingerprint],
    ['created', formatTime(record.createdAt)],
    ['updated', formatTime(record.updatedAt)],
    ['completed', formatTime(record.completedAt)],
    ['expires', formatTime(record.expiresAt)],
    ['tombstone', record.tombstoneMs === null ? "- (the janitor's TOMBSTONE_MS)" : `${record.tombstoneMs} ms after it finished (its job's own)`],
    ['result', record.result === null || record.result === undefined ? '-' : JSON.stringify(record.result)],
    ['error', record.error === null || record.error === undefined ? '-' : JSON.stringify(record.error)],
    ['payload', record.payload === null || record.payload === undefined ? '-' : JSON.stringify(record.payload)],
    ['steps', steps.length === 0 ? '-' : describeSteps(steps)],
  ];
  const width = Math.max(...rows.map(([name]) => name.length));
  const text = rows.map(([name, value]) => `${name.padEnd(width)}  ${value}`).join('\n');
  return steps.length === 0 ? text : `${text}\n\n${stepsTable(steps)}`;
}

/** A key deleted after its retention whose tombstone still refuses duplicates. */
function describeTombstone(tombstone: TombstoneRecord): string {
  const rows: Array<[string, string]> = [
    ['scope', tombstone.scope],
    ['key', tombstone.key],
    ['status', `tombstone (${tombstone.outcome}; result expired, duplicates are not run)`],
    ['finished', formatTime(tombstone.finishedAt)],
    ['refused until', formatTime(tombstone.expiresAt)],
    ['fingerprint sha256', tombstone.fingerprintHash],
  ];
  const width = Math.max(...rows.map(([name]) => name.length));
  return rows.map(([name, value]) => `${name.padEnd(width)}  ${value}`).join('\n');
}

function notFound(scope: string, key: string, json: boolean | undefined): void {
  const message = `No key "${key}" in scope "${scope}" (it never existed, or the janitor deleted it after its retention and its tombstone, if any, has expired).`;
  if (json) console.log(JSON.stringify({ found: false, scope, key }));
  console.error(message);
  process.exitCode = EXIT_NOT_FOUND;
}

/**
 * `keys get|list|release|purge`: inspect and repair idempotency keys in $SCHEMA of
 * $DATABASE_URL. Exit codes: see `exit-codes.ts`.
 */
export function registerKeysCommand(program: Command): void {
  const keys = program.command('keys').description('inspect and repair idempotency keys');

  keys
    .command('get')
    .description('show one key: status, owner, fence, lease, job, result or error, and its steps (ctx.step); or its tombstone once deleted after its retention')
    .argument('<scope>', 'the key\'s scope ("default" when the producer named none)')
    .argument('<key>', 'the idempotency key')
    .option('--json', 'print the key as JSON')
    .action(async (scope: string, key: string, options: { json?: boolean }) => {
      checkKey(scope, key);
      const found = await withDatabase(async (store) => {
        const record = await store.getKey(scope, key);
        if (record) return { record, steps: await store.loadSteps(scope, key) };
        const tombstone = await store.getTombstone(scope, key);
        return tombstone ? { tombstone } : undefined;
      });
      if (!found) return notFound(scope, key, options.json);
      const { tombstone } = found;
      if (tombstone) {
        console.log(options.json ? JSON.stringify({ ...JSON.parse(JSON.stringify(tombstone)), status: 'tombstone' }) : describeTombstone(tombstone));
        return;
      }
      const { record, steps } = found as { record: KeyRecord; steps: StepRecord[] };
      console.log(options.json ? JSON.stringify({ ...keyJson(record), steps: stepsJson(steps) }) : describeKey(record, steps));
    });

  keys
    .command('list')
    .description('list keys, most recently updated first')
    .option('--status <status>', `only keys in this status (${STATUSES.join(', ')})`, parseStatus)
    .option('--expired', 'only keys whose time is up: finished past expires_at, or processing with an ended lease')
    .option('--scope <scope>', 'only keys in this scope')
    .option('--limit <n>', `at most this many (1 to ${MAX_LIST_LIMIT})`, parseLimit, 50)
    .option('--json', 'print a JSON array')
    .action(async (options: { status?: KeyStatus; expired?: boolean; scope?: string; limit: number; json?: boolean }) => {
      if (options.scope !== undefined) assertValidKeyPart('scope', options.scope);
      const records = await withDatabase((store) =>
        store.listKeys({ status: options.status, scope: options.scope, expired: options.expired, limit: options.limit }),
      );
      if (options.json) {
        console.log(JSON.stringify(records.map(keyJson)));
        return;
      }
      if (records.length === 0) {
        console.log('No keys match.');
        return;
      }
      console.log(
        formatTable(
          ['SCOPE', 'KEY', 'STATUS', 'FENCE', 'ATTEMPTS', 'LOCKED UNTIL', 'EXPIRES', 'UPDATED', 'QUEUE', 'JOB ID'],
          records.map((r) => [
            r.scope,
            r.key,
            r.status,
            String(r.fence),
            String(r.attempts),
            formatTime(r.lockedUntil),
            formatTime(r.expiresAt),
            formatTime(r.updatedAt),
            r.queue ?? '-',
            r.jobId ?? '-',
          ]),
        ),
      );
      if (records.length === options.limit) console.log(`(first ${options.limit}; raise --limit for more)`);
    });

  keys
    .command('release')
    .description(
      'operator unlock: make a processing or failed key claimable again at once (recorded on the key). ' +
        'A worker still running it is fenced out; re-run its job (or let the sweeper re-enqueue it).',
    )
    .argument('<scope>', "the key's scope")
    .argument('<key>', 'the idempotency key')
    .requiredOption('--reason <text>', 'why (stored on the key with the time)')
    .option('--json', 'print the released key as JSON')
    .action(async (scope: string, key: string, options: { reason: string; json?: boolean }) => {
      checkKey(scope, key);
      if (options.reason.trim() === '') throw new ValidationError('INVALID_OPTIONS', 'reason', '--reason must not be empty.');
      const outcome = await withDatabase(async (store) => {
        const released = await store.releaseKey({ scope, key, reason: options.reason, actor: cliActor() });
        return released ?? { existing: await store.getKey(scope, key) };
      });
      if ('record' in outcome) {
        if (options.json) {
          console.log(JSON.stringify({ released: true, previousStatus: outcome.previousStatus, key: keyJson(outcome.record) }));
        } else {
          console.log(
            `Released key "${key}" in scope "${scope}" (was ${outcome.previousStatus}); the next claim takes it over ` +
              `(fence ${outcome.record.fence + 1}).` +
              (outcome.record.jobId ? ` Its last job was ${outcome.record.jobId} on queue "${outcome.record.queue}".` : ''),
          );
        }
        return;
      }
      if (!outcome.existing) return notFound(scope, key, options.json);
      const message =
        `Key "${key}" in scope "${scope}" is ${outcome.existing.status}; only processing or failed keys can be released. ` +
        'Releasing a completed key would run its effect a second time; use a new key for a new request.';
      if (options.json) console.log(JSON.stringify({ released: false, status: outcome.existing.status, scope, key }));
      console.error(message);
      process.exitCode = EXIT_CONFLICT;
    });

  keys
    .command('purge')
    .description(
      'delete completed and failed keys that finished longer ago than the duration, whatever their retention ' +
        '(processing keys are never purged). A duplicate of a purged key runs again.',
    )
    .requiredOption('--older-than <duration>', 'e.g. 30m, 24h, 7d', parseDuration)
    .option('--json', 'print the count as JSON')
    .action(async (options: { olderThan: number; json?: boolean }) => {
      const deleted = await withDatabase(async (store) => {
        let total = 0;
        // Partition by partition on a partitioned keys table, for the janitor's reason (see `store/sql/delete-expired-keys.ts`).
        const { partitions } = await store.tableLayout();
        for (const table of partitions.length > 0 ? partitions : ['idempotency_keys']) {
          for (;;) {
            const n = await store.purgeKeys(options.olderThan, PURGE_BATCH, table);
            total += n;
            if (n < PURGE_BATCH) break;
          }
        }
        return total;
      });
      if (options.json) console.log(JSON.stringify({ deleted, olderThanMs: options.olderThan }));
      else console.log(`Purged ${deleted} finished key${deleted === 1 ? '' : 's'} older than ${formatDuration(options.olderThan)}.`);
    });
}
