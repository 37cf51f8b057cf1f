import { sql } from 'kysely';
import { keySettledChannel } from '../channels.js';

/**
 * The end of a statement that settled a key in the CTE named `settled` (which returns `scope`,
 * `key`, `has_waiters`): a NOTIFY at commit for each settled key a waiter asked about (NOTIFY
 * serializes commits database-wide, so only then), and one row per settled key, so the caller
 * counts `rows.length` to know whether its UPDATE matched.
 */
export function notifyWaitersOf(schema: string, settled: string) {
  return sql`
    notified as (
      select pg_notify(${keySettledChannel(schema)}, json_build_object('scope', scope, 'key', key)::text)
        from ${sql.table(settled)} where has_waiters
    )
    select (select count(*) from notified) as notified from ${sql.table(settled)}`;
}
