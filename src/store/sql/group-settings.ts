import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';

/**
 * SQLSTATE `check_group_settings` raises when a setting that matters differs from its value at
 * the group's BEGIN: a job changed it for its group-mates.
 */
export const SETTING_CHANGED_STATE = 'IJ003';

/** Where a group's BEGIN keeps the settings it started with (a custom setting, local to the transaction). */
const STARTING_SETTINGS = 'idempotent_jobs.group_settings';

/**
 * The settings a job could change for the jobs after it in a shared transaction, with an effect
 * that matters: durability (`synchronous_commit`), who runs the statements and what they may
 * see (`role`, `session_authorization`, `row_security`, `session_replication_role`: triggers and
 * foreign keys off), where names resolve (`search_path`), time limits, read-only, and how
 * values read and print. Custom settings (`app.tenant`, as row-level security policies read
 * them) are added: those declared for the database or role ({@link customSettingNames}) and
 * those named in `GroupCommitOptions.watchSettings`.
 */
export const WATCHED_SETTINGS: readonly string[] = [
  'synchronous_commit',
  'role',
  'session_authorization',
  'row_security',
  'session_replication_role',
  'search_path',
  'statement_timeout',
  'lock_timeout',
  'idle_in_transaction_session_timeout',
  'transaction_read_only',
  'default_transaction_read_only',
  'timezone',
  'datestyle',
  'intervalstyle',
  'extra_float_digits',
  'bytea_output',
  'standard_conforming_strings',
];

/**
 * The custom settings (`x.y`) declared for this database or role (`ALTER DATABASE … SET
 * app.tenant = ''`, as row-level security set-ups declare the setting their policies read). A
 * custom setting that only a statement creates (`set_config('app.tenant', …)`) is invisible to
 * every catalog: such a name must be declared to be watched (`GroupCommitOptions.watchSettings`).
 * One read, made once per store.
 */
export async function customSettingNames(db: Kysely<any>): Promise<string[]> {
  const { rows } = await sql<{ name: string }>`
    select distinct split_part(config, '=', 1) as name
      from pg_db_role_setting as s, unnest(s.setconfig) as config
     where s.setdatabase in (0, (select oid from pg_database where datname = current_database()))
       and s.setrole in (0, (select oid from pg_roles where rolname = current_user))
       and split_part(config, '=', 1) like '%.%'
     order by 1`.execute(db);
  return rows.map((row) => row.name).filter((name) => name !== STARTING_SETTINGS);
}

/**
 * Keeps the watched settings' values as the group starts (after its BEGIN, in the same round
 * trip), for {@link checkGroupSettingsStatement} to compare at its end.
 */
export function keepGroupSettingsStatement(schema: string, names: readonly string[]): CompiledQuery {
  return CompiledQuery.raw(`select set_config('${STARTING_SETTINGS}', ${pg.escapeIdentifier(schema)}.group_settings($1::text[])::text, true)`, [names]);
}

/**
 * Compares the watched settings with their values at the group's BEGIN, in the pipeline of the
 * group's COMMIT, before it: raises {@link SETTING_CHANGED_STATE} (so nothing commits) when one
 * differs. A job that lowered `synchronous_commit` could otherwise make its group-mates' commit
 * non-durable; one that set `app.tenant` could run them under another tenant's policies.
 */
export function checkGroupSettingsStatement(schema: string, names: readonly string[]): CompiledQuery {
  return CompiledQuery.raw(`select ${pg.escapeIdentifier(schema)}.check_group_settings($1::text[])`, [names]);
}

/** DDL of `group_settings(names)` and `check_group_settings(names)`, for the migration that installs them. */
export function groupSettingsFunctionsDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'group_settings')}(p_names text[])
    returns text[]
    language plpgsql stable as $group_settings$
    begin
      return array(select coalesce(current_setting(n, true), '') from unnest(p_names) with ordinality as t(n, o) order by o);
    end;
    $group_settings$;

    create or replace function ${sql.id(schema, 'check_group_settings')}(p_names text[])
    returns void
    language plpgsql stable as $check_group_settings$
    declare
      v_then text[] := coalesce(current_setting(${sql.lit(STARTING_SETTINGS)}, true), '{}')::text[];
      v_now text[] := ${sql.id(schema, 'group_settings')}(p_names);
      v_changed text[];
    begin
      if v_now is distinct from v_then then
        select array_agg(p_names[i]) into v_changed
          from generate_subscripts(p_names, 1) as i
         where v_now[i] is distinct from v_then[i];
        raise exception 'a job of this group changed % inside the shared transaction', coalesce(array_to_string(v_changed, ', '), 'a setting')
          using errcode = ${sql.lit(SETTING_CHANGED_STATE)}, detail = coalesce(array_to_string(v_changed, ','), '');
      end if;
    end;
    $check_group_settings$`;
}
