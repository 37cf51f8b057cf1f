/**
 * What the demo's multi-step payments did, read from the tables after a run: per step, calls
 * and effects; per taken-over key, the step where its first owner stopped and the step where
 * the next one resumed; and the checks that make the demo fail (a database effect twice, a
 * resumption at the wrong step, an e-mail repeated where no owner lost the key inside the e-mail step).
 */
import { sql, type Kysely } from 'kysely';
import { PAYMENT_STEPS } from '../workers/payments/payments-domain.js';

const STEP_ORDER = [...PAYMENT_STEPS.map((step) => step.name), 'completion'] as const;
type StepName = (typeof STEP_ORDER)[number];

/** Calls and effects of one step over the whole run. */
export interface StepTotals {
  readonly step: StepName;
  readonly kind: string;
  /** Runs of the step's code (database steps: logged before their transaction; external: calls received). */
  readonly calls: number;
  /** What exists afterwards: rows committed, charges made, e-mails sent. */
  readonly effects: number;
  /** Keys with more than one effect of this step. */
  readonly keysWithRepeats: number;
}

/** One key that changed hands: where its earlier owner stopped, where the next one resumed. */
export interface Resumption {
  readonly scope: string;
  readonly key: string;
  readonly lostFence: number;
  readonly lostPid: number | undefined;
  readonly fence: number;
  readonly pid: number | undefined;
  /** The first step the earlier owner had not recorded. */
  readonly stoppedAt: StepName;
  /** True when the earlier owner had started that step (called the system, or begun the transaction). */
  readonly inside: boolean;
  /** The first step the new owner ran. */
  readonly resumedAt: StepName;
  /** Calls the stopped step's system received under the earlier owner's fence (external steps). */
  readonly callsBeforeTakeover: number;
}

export interface PaymentReport {
  readonly steps: readonly StepTotals[];
  readonly resumptions: readonly Resumption[];
  /** E-mails beyond the first per key. */
  readonly emailRepeats: number;
  /** Keys with more than one row in a database effect table (reservations, ledger, payments). */
  readonly duplicatedKeys: number;
  /** Everything that contradicts the guarantees; empty when the run is correct. */
  readonly problems: readonly string[];
}

interface Activity {
  readonly scope: string;
  readonly key: string;
  readonly step: StepName;
  readonly fence: number;
  readonly pid: number;
}

/** Reads the demo's tables in `schema` and checks them. */
export async function paymentReport(db: Kysely<any>, schema: string): Promise<PaymentReport> {
  const t = (name: string) => sql.id(schema, name);
  const count = async (query: ReturnType<typeof sql<{ n: string }>>) => Number((await query.execute(db)).rows[0]!.n);
  const repeatedKeys = (table: string) =>
    count(sql`select count(*) as n from (select 1 from ${t(table)} group by scope, key having count(*) > 1) d`);
  const callsOf = (step: string) => count(sql`select count(*) as n from ${t('step_calls')} where step = ${step}`);
  const rows = (table: string) => count(sql`select count(*) as n from ${t(table)}`);

  const steps: StepTotals[] = [
    { step: 'reserve', kind: 'database', calls: await callsOf('reserve'), effects: await rows('reservations'), keysWithRepeats: await repeatedKeys('reservations') },
    { step: 'charge', kind: 'external', calls: await rows('provider_calls'), effects: await rows('provider_charges'), keysWithRepeats: 0 },
    { step: 'ledger', kind: 'database', calls: await callsOf('ledger'), effects: await rows('ledger'), keysWithRepeats: await repeatedKeys('ledger') },
    { step: 'email', kind: 'external', calls: await rows('emails'), effects: await rows('emails'), keysWithRepeats: await repeatedKeys('emails') },
    { step: 'completion', kind: 'ctx.transaction', calls: await rows('payments'), effects: await rows('payments'), keysWithRepeats: await repeatedKeys('payments') },
  ];
  const problems: string[] = [];
  const duplicatedKeys = steps.filter((s) => s.kind !== 'external').reduce((sum, s) => sum + s.keysWithRepeats, 0);
  if (duplicatedKeys > 0) problems.push(`${counted(duplicatedKeys, 'key')} ${duplicatedKeys === 1 ? 'has' : 'have'} a database effect more than once`);

  // Everything the keys that changed hands did, by step and fence.
  const takenOver = sql`select scope, key from ${t('idempotency_keys')} where fence > 1`;
  const activity: Activity[] = (
    await sql<{ scope: string; key: string; step: StepName; fence: string; pid: number }>`
      select scope, key, step, fence, worker_pid as pid from ${t('step_calls')} where (scope, key) in (${takenOver})
      union all select scope, key, 'charge', fence, worker_pid from ${t('provider_calls')} where (scope, key) in (${takenOver})
      union all select scope, key, 'email', fence, worker_pid from ${t('emails')} where (scope, key) in (${takenOver})
      union all select scope, key, 'completion', fence, worker_pid from ${t('payments')} where (scope, key) in (${takenOver})`.execute(db)
  ).rows.map((r) => ({ ...r, fence: Number(r.fence) }));
  const keys = (
    await sql<{ scope: string; key: string; fence: string }>`
      select scope, key, fence from ${t('idempotency_keys')} where fence > 1 order by updated_at`.execute(db)
  ).rows;
  const recorded = (
    await sql<{ scope: string; key: string; name: StepName; fence: string; starts: number }>`
      select scope, key, name, fence, starts from ${t('job_steps')}
       where recorded_at is not null and (scope, key) in (${takenOver})`.execute(db)
  ).rows;

  const resumptions: Resumption[] = [];
  for (const row of keys) {
    const fence = Number(row.fence);
    const lostFence = fence - 1;
    const mine = activity.filter((a) => a.scope === row.scope && a.key === row.key);
    const steps = new Map(recorded.filter((r) => r.scope === row.scope && r.key === row.key).map((r) => [r.name, r]));
    // The earlier owner stopped at the first step it had not recorded (a step recorded under
    // an earlier fence is replayed, never run again).
    const stoppedAt = STEP_ORDER.find((name) => name === 'completion' || !steps.has(name) || Number(steps.get(name)!.fence) >= fence)!;
    const before = mine.filter((a) => a.fence === lostFence);
    const after = mine.filter((a) => a.fence === fence);
    const inside = before.some((a) => a.step === stoppedAt) || (steps.get(stoppedAt)?.starts ?? 0) > 1;
    const resumedAt = STEP_ORDER.find((name) => after.some((a) => a.step === name)) ?? 'completion';
    const callsBeforeTakeover = before.filter((a) => a.step === stoppedAt && (stoppedAt === 'charge' || stoppedAt === 'email')).length;
    resumptions.push({
      scope: row.scope,
      key: row.key,
      lostFence,
      lostPid: before[0]?.pid,
      fence,
      pid: after[0]?.pid,
      stoppedAt,
      inside,
      resumedAt,
      callsBeforeTakeover,
    });
    if (resumedAt !== stoppedAt) {
      problems.push(`${row.scope}/${row.key} stopped at ${stoppedAt} under fence ${lostFence} but resumed at ${resumedAt} under fence ${fence}`);
    }
    const ranAgain = STEP_ORDER.slice(0, STEP_ORDER.indexOf(stoppedAt)).filter((name) => after.some((a) => a.step === name));
    if (ranAgain.length > 0) problems.push(`${row.scope}/${row.key}: ${ranAgain.join(', ')} ran again after being recorded`);
  }

  // E-mails: at most one per fence, and a second one only where a worker lost the key inside the
  // step: sent under a fence older than the one that recorded the step. A key may change hands
  // more than once inside it (its owners dead, or alive past their lease under load), so every
  // older fence counts, not only the one just before the last.
  const emailsPerFence = await count(sql`
    select count(*) as n from (select 1 from ${t('emails')} group by scope, key, fence having count(*) > 1) d`);
  if (emailsPerFence > 0) problems.push(`${counted(emailsPerFence, 'key')} got two e-mails under one fence`);
  const emailRepeats = steps.find((s) => s.step === 'email')!.effects - (await count(sql`select count(distinct (scope, key)) as n from ${t('emails')}`));
  const emailRecordedUnder = new Map(recorded.filter((r) => r.name === 'email').map((r) => [`${r.scope}\u0000${r.key}`, Number(r.fence)]));
  const explained = activity.filter((a) => a.step === 'email' && a.fence < (emailRecordedUnder.get(`${a.scope}\u0000${a.key}`) ?? 0)).length;
  if (emailRepeats !== explained) {
    problems.push(`${emailRepeats} repeated e-mails, but workers lost their key inside the e-mail step after sending ${explained}`);
  }
  return { steps, resumptions, emailRepeats, duplicatedKeys, problems };
}

/** The report as text: the steps table, then one line per key that changed hands. */
export function formatPaymentReport(report: PaymentReport, killedPid: number | undefined, maxKeys = 20): string {
  const lines = ['\nsteps (calls: runs of the step; effects: rows committed, charges made, e-mails sent)'];
  lines.push(`  ${'step'.padEnd(11)} ${'kind'.padEnd(16)} ${'calls'.padStart(6)} ${'effects'.padStart(8)}  note`);
  for (const s of report.steps) {
    const note =
      s.step === 'charge'
        ? `${counted(s.calls - s.effects, 'repeated call')}, deduplicated by the provider (stepKey)`
        : s.step === 'email'
          ? `${counted(report.emailRepeats, 'e-mail')} sent twice (the mailer does not deduplicate)`
          : s.kind === 'database'
            ? `${counted(s.calls - s.effects, 'run')} rolled back, ${counted(s.keysWithRepeats, 'key')} twice`
            : `${counted(s.keysWithRepeats, 'key')} twice`;
    lines.push(`  ${s.step.padEnd(11)} ${s.kind.padEnd(16)} ${String(s.calls).padStart(6)} ${String(s.effects).padStart(8)}  ${note}`);
  }
  const where = (r: Resumption) => `${r.inside ? 'inside' : 'before'} ${r.stoppedAt}`;
  const byStop = new Map<string, number>();
  const ordered = [...report.resumptions].sort((a, b) => STEP_ORDER.indexOf(a.stoppedAt) - STEP_ORDER.indexOf(b.stoppedAt) || Number(a.inside) - Number(b.inside));
  for (const r of ordered) byStop.set(where(r), (byStop.get(where(r)) ?? 0) + 1);
  const killed = killedPid === undefined ? '' : ` (the killed worker was pid ${killedPid})`;
  lines.push(`\nkeys taken over: ${report.resumptions.length}${killed}; where their owner stopped: ${[...byStop].map(([at, n]) => `${at} ${n}`).join(', ') || '-'}`);
  for (const r of ordered.slice(0, maxKeys)) {
    const replayed = STEP_ORDER.slice(0, STEP_ORDER.indexOf(r.resumedAt));
    const notes = [replayed.length > 0 ? `${replayed.join(', ')} replayed` : ''];
    if (r.inside && r.stoppedAt === 'charge') {
      notes.push(r.callsBeforeTakeover > 0 ? 'charge called again, the provider deduplicated it' : 'charge started again (the first call had not reached the provider)');
    }
    if (r.inside && r.stoppedAt === 'email') {
      notes.push(r.callsBeforeTakeover > 0 ? 'e-mail sent again' : 'e-mail started again (the first had not been sent)');
    }
    const said = notes.filter((note) => note !== '');
    lines.push(
      `  ${`${r.scope}/${r.key}`.padEnd(16)} stopped ${where(r)} (fence ${r.lostFence}, ${pidOf(r.lostPid)}) → ` +
        `resumed at ${r.resumedAt} (fence ${r.fence}, ${pidOf(r.pid)})${said.length > 0 ? `: ${said.join('; ')}` : ''}`,
    );
  }
  if (report.resumptions.length > maxKeys) lines.push(`  … and ${report.resumptions.length - maxKeys} more`);
  return lines.join('\n');
}

/** `1 run`, `2 runs`, `0 keys`. */
export function counted(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

/**
 * A run's worker: every run writes its pid before anything else (`step_calls`, step `run`), so
 * only a worker killed between its claim and that first write is unknown.
 */
function pidOf(pid: number | undefined): string {
  return pid === undefined ? 'pid unknown: killed before its first write' : `pid ${pid}`;
}
