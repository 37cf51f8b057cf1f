import { formatDuration, formatTime } from '../text-table.js';
import { stepResultBytes } from '../protocol/job-steps.js';
import { html, isolated, type SafeHtml } from './html.js';
import type { ScheduleInfo } from '../ops/schedules.js';
import type { KeyRecord, KeyStatus, KeyAuditEntry, KeyStats, StepRecord, KeyCursor, KeyPage, TombstoneRecord } from '../store/records.js';

/**
 * The key inspector's views: server-rendered HTML fragments that the page's script puts in its
 * `<main>`. Every value from the database goes through {@link html}, which escapes it. Links
 * are `#/…` routes: the script fetches `view/…` for them with the admin token.
 */

/** The statuses, in the order the pages list them. */
export const KEY_STATUSES: readonly KeyStatus[] = ['processing', 'completed', 'failed'];

/** A JSON value shown in full up to this many characters, then cut (the rest is in `keys get`). */
const MAX_JSON_CHARS = 16_384;

/** What the overview shows. */
export interface OverviewData {
  readonly stats: KeyStats;
  readonly expiredLeases: readonly KeyRecord[];
  readonly failures: readonly KeyRecord[];
  readonly takeovers: readonly KeyRecord[];
  readonly actions: readonly KeyAuditEntry[];
  /** The database's clock, for ages. */
  readonly now: Date;
}

/** What a key's page shows. */
export interface KeyPageData {
  readonly record: KeyRecord;
  readonly steps: readonly StepRecord[];
  readonly audit: readonly KeyAuditEntry[];
  /** The BullMQ job's state, or why it was not read. */
  readonly jobState: string;
  readonly now: Date;
  /** The outcome of an action just taken on the key. */
  readonly notice?: Notice;
  /**
   * For a schedule's tick (scope `schedule:<name>`): its schedule, or `'removed'` when no live
   * schedule has that name any more. Unset for other keys.
   */
  readonly schedule?: ScheduleInfo | 'removed';
}

/** A line at the top of a view: what an action did, or why it was refused. */
export interface Notice {
  readonly kind: 'done' | 'refused';
  readonly text: string;
}

/** What a list of keys shows. */
export interface KeyListData {
  readonly page: KeyPage;
  readonly status?: KeyStatus;
  readonly scope?: string;
  /** Keys per page, when the request chose it (kept in the paging links). */
  readonly limit?: number;
  /** The page was read backward (a "previous" link). */
  readonly backward: boolean;
  /** The page was read from a cursor (not the first page). */
  readonly fromCursor: boolean;
  readonly now: Date;
}

/** The hash route of a key's page. */
export function keyHref(scope: string, key: string): string {
  return `#/key?${new URLSearchParams({ scope, key })}`;
}

/** The hash route of a list of keys. */
export function listHref(filter: { status?: KeyStatus; scope?: string; limit?: number; after?: KeyCursor; before?: KeyCursor }): string {
  const query = new URLSearchParams();
  if (filter.status) query.set('status', filter.status);
  if (filter.scope !== undefined) query.set('scope', filter.scope);
  if (filter.limit !== undefined) query.set('limit', String(filter.limit));
  if (filter.after) {
    query.set('afterScope', filter.after.scope);
    query.set('afterKey', filter.after.key);
  }
  if (filter.before) {
    query.set('beforeScope', filter.before.scope);
    query.set('beforeKey', filter.before.key);
  }
  const text = query.toString();
  return text === '' ? '#/keys' : `#/keys?${text}`;
}

/** The overview: counts, the oldest processing key, expired leases, recent failures, takeovers and operator actions. */
export function overviewView(data: OverviewData): SafeHtml {
  const { stats, now } = data;
  const oldest = stats.oldestProcessing;
  return html`<section class="view" data-view="overview">
<h2>Overview</h2>
<table class="counts">
<tr><th>Processing</th><td><a href="${listHref({ status: 'processing' })}" data-count="processing">${stats.processing}</a></td></tr>
<tr><th>Completed</th><td><a href="${listHref({ status: 'completed' })}" data-count="completed">${stats.completed}</a></td></tr>
<tr><th>Failed</th><td><a href="${listHref({ status: 'failed' })}" data-count="failed">${stats.failed}</a></td></tr>
<tr><th>Expired leases</th><td data-count="expired-leases">${stats.expiredLeases}</td></tr>
<tr><th>Expired keys (the janitor deletes them)</th><td data-count="expired-keys">${stats.expiredKeys}</td></tr>
<tr><th>Tombstones (deleted keys whose duplicates are still refused)</th><td data-count="tombstones">${stats.tombstones}</td></tr>
<tr><th>Outbox rows not yet relayed</th><td data-count="outbox-unsent">${stats.outboxUnsent}</td></tr>
</table>
<p>Oldest processing key: ${
    oldest
      ? html`<a href="${keyHref(oldest.scope, oldest.key)}">${isolated(oldest.key)}</a> in scope ${isolated(oldest.scope)}, created ${formatDuration(oldest.ageMs)} ago`
      : 'none'
  }</p>
<h3>Expired leases</h3>
${keyTable(data.expiredLeases, now, 'No processing key has an expired lease.')}
<h3>Recent failures</h3>
${keyTable(data.failures, now, 'No failed keys.')}
<h3>Recent takeovers</h3>
${keyTable(data.takeovers, now, 'No key was claimed more than once.')}
<h3>Recent operator actions</h3>
${auditTable(data.actions, true)}
</section>`;
}

/** A list of keys by status and scope, with keyset paging links. */
export function keyListView(data: KeyListData): SafeHtml {
  const { page, status, scope, limit, backward, fromCursor } = data;
  const first = page.records[0];
  const last = page.records.at(-1);
  // Reading forward, `more` says whether a next page exists; a previous one exists when the
  // page came from a cursor. Reading backward, the other way round.
  const hasPrevious = backward ? page.more : fromCursor;
  const hasNext = backward ? true : page.more;
  const cursor = (record: KeyRecord): KeyCursor => ({ scope: record.scope, key: record.key });
  const title = html`${status ? `${capitalize(status)} keys` : 'All keys'}${scope !== undefined ? html` in scope ${isolated(scope)}` : ''}`;
  return html`<section class="view" data-view="list">
<h2>${title}</h2>
<form class="filters" data-nav="/keys">
<label>Status <select name="status"><option value="">any</option>${KEY_STATUSES.map(
    (s) => html`<option value="${s}"${s === status ? html` selected` : ''}>${s}</option>`,
  )}</select></label>
<label>Scope <input name="scope" value="${scope ?? ''}" maxlength="255"></label>
<button type="submit">List</button>
</form>
${keyTable(page.records, data.now, 'No keys match.')}
<nav class="paging">
<a href="${listHref({ status, scope, limit })}">First page</a>
${hasPrevious && first ? html`<a href="${listHref({ status, scope, limit, before: cursor(first) })}" rel="prev">Previous page</a>` : ''}
${hasNext && last ? html`<a href="${listHref({ status, scope, limit, after: cursor(last) })}" rel="next">Next page</a>` : ''}
</nav>
</section>`;
}

/** One key: its row, the BullMQ job's state, its steps, its operator actions and the release form. */
export function keyView(data: KeyPageData): SafeHtml {
  const { record: r, now } = data;
  const leaseEnded = r.lockedUntil !== null && r.lockedUntil.getTime() <= now.getTime();
  const lease =
    r.lockedUntil === null
      ? '-'
      : `${formatTime(r.lockedUntil)} (${leaseEnded ? `ended ${formatDuration(now.getTime() - r.lockedUntil.getTime())} ago` : `${formatDuration(r.lockedUntil.getTime() - now.getTime())} left`})`;
  const releasable = r.status === 'processing' || r.status === 'failed';
  return html`<section class="view" data-view="key">
${data.notice ? noticeView(data.notice) : ''}
<h2>Key <code class="key-name">${isolated(r.key)}</code> in scope <code class="scope-name">${isolated(r.scope)}</code></h2>
<dl class="key-fields">
<dt>Status</dt><dd data-field="status"><span class="status status-${r.status}">${r.status}</span></dd>
<dt>Fence</dt><dd data-field="fence">${r.fence}</dd>
<dt>Attempts</dt><dd data-field="attempts">${r.attempts}</dd>
<dt>Owner</dt><dd data-field="owner">${r.owner ?? '- (none: the next claim takes the key over)'}</dd>
<dt>Lease until</dt><dd data-field="lease">${lease}</dd>
<dt>Job id</dt><dd data-field="job-id">${r.jobId === null ? '-' : isolated(r.jobId)}</dd>
<dt>Queue</dt><dd data-field="queue">${r.queue === null ? '-' : isolated(r.queue)}</dd>
<dt>Job name</dt><dd data-field="job-name">${r.jobName === null ? '-' : isolated(r.jobName)}</dd>
<dt>BullMQ job state</dt><dd data-field="job-state">${data.jobState}</dd>
<dt>Created</dt><dd>${formatTime(r.createdAt)}</dd>
<dt>Updated</dt><dd>${formatTime(r.updatedAt)}</dd>
<dt>Completed</dt><dd>${formatTime(r.completedAt)}</dd>
<dt>Expires</dt><dd data-field="expires">${formatTime(r.expiresAt)}</dd>
<dt>Tombstone window</dt><dd data-field="tombstone-ms">${r.tombstoneMs === null ? "- (the janitor's TOMBSTONE_MS)" : `${r.tombstoneMs} ms after it finished (its job's own)`}</dd>
</dl>
${data.schedule ? scheduleFields(data.schedule) : ''}
<h3>Result</h3>
${jsonBlock(r.result, 'result')}
<h3>Error</h3>
${jsonBlock(r.error, 'error')}
<h3>Steps</h3>
${stepsTable(data.steps)}
<h3>Operator actions</h3>
${auditTable(data.audit, false)}
${releasable ? releaseForm(r) : html`<p class="hint">Only processing or failed keys can be released: releasing a completed key would run its effect again.</p>`}
</section>`;
}

/** A key deleted after its retention whose tombstone still refuses its duplicates: what is left of it. */
export function tombstoneView(tombstone: TombstoneRecord): SafeHtml {
  return html`<section class="view" data-view="tombstone">
<h2>Key <code class="key-name">${isolated(tombstone.key)}</code> in scope <code class="scope-name">${isolated(tombstone.scope)}</code></h2>
<p class="notice notice-done">The key ${tombstone.outcome} and was deleted after its retention; only its tombstone is left. A duplicate is answered "${tombstone.outcome}, result expired" and not run; another payload is refused as reused.</p>
<dl class="key-fields">
<dt>Status</dt><dd data-field="status"><span class="status status-tombstone">tombstone (${tombstone.outcome})</span></dd>
<dt>Finished</dt><dd data-field="finished">${formatTime(tombstone.finishedAt)}</dd>
<dt>Refused until</dt><dd data-field="refused-until">${formatTime(tombstone.expiresAt)}</dd>
<dt>Fingerprint (SHA-256)</dt><dd data-field="fingerprint-hash"><code>${tombstone.fingerprintHash}</code></dd>
</dl>
</section>`;
}

/** The search form's answer when no such key exists. */
export function keyNotFoundView(scope: string, key: string): SafeHtml {
  return html`<section class="view" data-view="not-found">
<h2>No such key</h2>
<p class="notice notice-refused">No key <code>${isolated(key)}</code> in scope <code>${isolated(scope)}</code>: it never existed, or the janitor deleted it after its retention and no tombstone is left.</p>
<p><a href="${listHref({ scope })}">Keys in scope ${isolated(scope)}</a></p>
</section>`;
}

/** A refusal or an error, as a view (401, 403, 400, 404, 409, 5xx). */
export function messageView(kind: string, title: string, text: string): SafeHtml {
  return html`<section class="view" data-view="message" data-kind="${kind}">
<h2>${title}</h2>
<p class="notice notice-refused">${text}</p>
</section>`;
}

function noticeView(notice: Notice): SafeHtml {
  return html`<p class="notice notice-${notice.kind}" role="status">${notice.text}</p>`;
}

function releaseForm(r: KeyRecord): SafeHtml {
  return html`<h3>Release</h3>
<form class="release" data-post="/release">
<input type="hidden" name="scope" value="${r.scope}">
<input type="hidden" name="key" value="${r.key}">
<p class="hint">Makes the key claimable at once: the next claim takes it over (fence ${r.fence + 1}); a worker still running it is fenced out. Re-run its job, or let the sweeper re-enqueue it.</p>
<label>Reason <textarea name="reason" required maxlength="1000" rows="2"></textarea></label>
<button type="submit">Release key</button>
</form>`;
}

function keyTable(records: readonly KeyRecord[], now: Date, empty: string): SafeHtml {
  if (records.length === 0) return html`<p class="empty">${empty}</p>`;
  return html`<table class="keys">
<thead><tr><th>Scope</th><th>Key</th><th>Status</th><th>Fence</th><th>Attempts</th><th>Lease until</th><th>Updated</th><th>Queue</th><th>Job id</th></tr></thead>
<tbody>${records.map(
    (r) => html`<tr>
<td>${isolated(r.scope)}</td><td><a href="${keyHref(r.scope, r.key)}">${isolated(r.key)}</a></td><td><span class="status status-${r.status}">${r.status}</span></td>
<td>${r.fence}</td><td>${r.attempts}</td><td>${formatTime(r.lockedUntil)}</td><td title="${formatTime(r.updatedAt)}">${ago(r.updatedAt, now)}</td>
<td>${r.queue === null ? '-' : isolated(r.queue)}</td><td>${r.jobId === null ? '-' : isolated(r.jobId)}</td></tr>`,
  )}</tbody>
</table>`;
}

function stepsTable(steps: readonly StepRecord[]): SafeHtml {
  if (steps.length === 0) return html`<p class="empty">No steps (the job has no <code>ctx.step</code>, or has not reached one).</p>`;
  return html`<table class="steps">
<thead><tr><th>#</th><th>Step</th><th>Starts</th><th>Fence</th><th>Started</th><th>Recorded</th><th>Result</th></tr></thead>
<tbody>${steps.map((step) => {
    const bytes = stepResultBytes(step);
    return html`<tr data-step="${step.name}">
<td>${step.position}</td><td>${isolated(step.name)}</td><td>${step.starts}</td><td>${step.fence}</td><td>${formatTime(step.startedAt)}</td>
<td>${step.recordedAt === null ? 'not recorded' : formatTime(step.recordedAt)}</td>
<td>${step.recordedAt === null ? '-' : html`<pre class="json">${jsonText(step.result)}</pre><span class="hint">${bytes} bytes</span>`}</td></tr>`;
  })}</tbody>
</table>`;
}

function auditTable(entries: readonly KeyAuditEntry[], withKey: boolean): SafeHtml {
  if (entries.length === 0) return html`<p class="empty">None recorded.</p>`;
  return html`<table class="audit">
<thead><tr><th>At</th>${withKey ? html`<th>Key</th>` : ''}<th>Action</th><th>By</th><th>Reason</th><th>Detail</th></tr></thead>
<tbody>${entries.map(
    (e) => html`<tr>
<td>${formatTime(e.at)}</td>${withKey ? html`<td><a href="${keyHref(e.scope, e.key)}">${isolated(e.key)}</a> (${isolated(e.scope)})</td>` : ''}
<td>${e.action}</td><td class="actor">${isolated(e.actor)}</td><td class="reason">${isolated(e.reason)}</td><td><code>${JSON.stringify(e.detail)}</code></td></tr>`,
  )}</tbody>
</table>`;
}

function jsonBlock(value: unknown, field: string): SafeHtml {
  if (value === null || value === undefined) return html`<p class="empty" data-field="${field}">-</p>`;
  return html`<pre class="json" data-field="${field}">${jsonText(value)}</pre>`;
}

function jsonText(value: unknown): string {
  // Bidirectional controls as JSON escapes (the same value): shown, not applied to the page.
  const text = (JSON.stringify(value, null, 2) ?? String(value)).replace(/[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return text.length <= MAX_JSON_CHARS ? text : `${text.slice(0, MAX_JSON_CHARS)}\n… (${text.length} characters; \`idempotent-jobs keys get --json\` shows all)`;
}

function ago(date: Date, now: Date): string {
  const ms = now.getTime() - date.getTime();
  return ms >= 0 ? `${formatDuration(ms)} ago` : formatTime(date);
}

function capitalize(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** The schedule a tick key belongs to: its spec, policy, queue, last and next tick. */
function scheduleFields(schedule: ScheduleInfo | 'removed'): SafeHtml {
  if (schedule === 'removed') return html`<h3>Schedule</h3>
<p class="hint" data-field="schedule">This key is a tick of a schedule that has since been removed.</p>`;
  const spec = schedule.kind === 'interval' ? `every ${formatDuration(Number(schedule.spec))}` : `${schedule.spec} (${schedule.timezone})`;
  return html`<h3>Schedule</h3>
<dl class="key-fields" data-field="schedule">
<dt>Name</dt><dd>${isolated(schedule.name)}</dd>
<dt>Spec</dt><dd data-field="schedule-spec">${spec}</dd>
<dt>Missed ticks</dt><dd>${schedule.missed === 'all' ? `all (max ${schedule.maxMissed})` : 'latest'}</dd>
<dt>Last tick</dt><dd data-field="schedule-last-tick">${schedule.lastTick ? formatTime(schedule.lastTick) : '-'}</dd>
<dt>Next tick</dt><dd data-field="schedule-next-tick">${schedule.nextTick ? formatTime(schedule.nextTick) : 'none'}</dd>
</dl>`;
}
