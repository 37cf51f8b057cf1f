import { CompiledQuery, sql, type Kysely } from 'kysely';
import pg from 'pg';

import { prepared } from '../named-statements.js';

/**
 * SQLSTATE `check_group_state` raises when the shared transaction's state differs from what the
 * group's BEGIN kept: a job left something behind for its group-mates.
 */
export const SETTING_CHANGED_STATE = 'IJ003';

/** Where migration 016's `keep` kept the settings (its functions stay for workers of earlier versions). */
const STARTING_SETTINGS = 'idempotent_jobs.group_settings';

/** Where a group's BEGIN keeps the state it started with (a custom setting, local to the transaction). */
const STARTING_STATE = 'idempotent_jobs.group_state';

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
 * The custom settings (`x.y`) that matter on this database: those declared for this database or
 * role (`ALTER DATABASE … SET app.tenant = ''`, as row-level security set-ups declare the setting
 * their policies read), and those named by a literal in the database's own code: a
 * `set_config('app.tenant', …)`, a `current_setting('app.tenant')` or a `SET [LOCAL] app.tenant`
 * in the body of a function or procedure (triggers' included) of a schema other than the
 * system's, or in a row-level security policy. A name only computed at run time
 * (`set_config(v_name, …)`) is invisible to this read, and to every catalog (Postgres lists no
 * custom setting a statement created): such a name must be named to be watched
 * (`GroupCommitOptions.watchSettings`). One read, made once per store: code created later is
 * read by the next process.
 */
export async function customSettingNames(db: Kysely<any>): Promise<string[]> {
  const literal = `(?:set_config|current_setting)\\s*\\(\\s*'([A-Za-z_][A-Za-z0-9_$]*\\.[A-Za-z0-9_$.]+)'`;
  const setStatement = `\\mset\\s+(?:local\\s+|session\\s+)?([A-Za-z_][A-Za-z0-9_$]*\\.[A-Za-z0-9_$.]+)\\s*(?:=|\\mto\\M)`;
  const { rows } = await sql<{ name: string }>`
    with declared as (
      select split_part(config, '=', 1) as name
        from pg_db_role_setting as s, unnest(s.setconfig) as config
       where s.setdatabase in (0, (select oid from pg_database where datname = current_database()))
         and s.setrole in (0, (select oid from pg_roles where rolname = current_user))
    ), code as (
      select p.prosrc as text
        from pg_proc as p
        join pg_namespace as n on n.oid = p.pronamespace
       where n.nspname not in ('pg_catalog', 'information_schema')
         and n.nspname not like 'pg\\_toast%'
         and p.prolang not in (select oid from pg_language where lanname in ('c', 'internal'))
      union all
      select coalesce(pg_get_expr(polqual, polrelid), '') || ' ' || coalesce(pg_get_expr(polwithcheck, polrelid), '') from pg_policy
    ), named as (
      select name from declared
      union
      select (regexp_matches(text, ${literal}, 'gi'))[1] from code
      union
      select lower((regexp_matches(text, ${setStatement}, 'gi'))[1]) from code
    )
    select distinct name from named where name like '%.%' order by 1`.execute(db);
  // The library's own (where a group keeps its start) are no job's.
  return rows.map((row) => row.name).filter((name) => !name.startsWith('idempotent_jobs.'));
}

/**
 * The part of a transaction's state a group compares as one text: the number of open cursors
 * (`pg_cursors`: `DECLARE`, a function's `OPEN` of a refcursor; not the unnamed portal the
 * statement itself runs in, which `pg_cursors` lists when its statement is a named one) and of prepared statements made
 * by SQL (`PREPARE`, also through a function's `EXECUTE`), then `|` and the watched settings'
 * values, each name written into the text (a store's names are the same for every group, so the
 * statement is still parsed and planned once per connection). One expression of the statement
 * itself: a function would pay a query's set-up for each part, and an `unnest` of the names
 * half as much again as the calls themselves.
 */
function stateNow(names: readonly string[]): string {
  return `${CURSORS_NOW} || ',' || ${PREPARED_STATEMENTS_NOW} || '|' || ${settingsNow(names)}`;
}

/** The watched settings' values, as text (see {@link stateNow}). */
function settingsNow(names: readonly string[]): string {
  const settings = names.map((name) => `coalesce(pg_catalog.current_setting(${pg.escapeLiteral(name)}, true), '')`);
  return `array[${settings.join(', ') || ''}]::text[]::text`;
}

const CURSORS_NOW = `(select pg_catalog.count(*) from pg_catalog.pg_cursors where name <> '')::text`;

/**
 * Reading `pg_prepared_statements` builds a row, with its text, for every statement the session
 * prepared (the library's own named statements among them): about half of a full check's cost.
 */
const PREPARED_STATEMENTS_NOW = `(select pg_catalog.count(*) from pg_catalog.pg_prepared_statements where from_sql)::text`;

/** What {@link stateNow} kept, its parts read back: the cursors, the prepared statements, `|` and the settings. */
const KEPT = `pg_catalog.current_setting('${STARTING_STATE}', true)`;
const KEPT_CURSORS_AND_SETTINGS = `pg_catalog.split_part(${KEPT}, ',', 1) || pg_catalog.substr(${KEPT}, pg_catalog.strpos(${KEPT}, '|'))`;
const KEPT_PREPARED_STATEMENTS = `pg_catalog.split_part(pg_catalog.split_part(${KEPT}, '|', 1), ',', 2)`;

/**
 * The marks temporary objects are compared from: the highest OIDs of `pg_class`, `pg_proc` and
 * `pg_type` as the group begins. An object created later has a higher OID (until the OID counter
 * wraps around, after four billion objects), so the check reads only the newest rows of each
 * catalog's OID index, and nothing while the session has no temporary schema.
 */
const MARKS_NOW = `(select pg_catalog.max(oid) from pg_catalog.pg_class)::text
  || ',' || (select pg_catalog.max(oid) from pg_catalog.pg_proc)::text
  || ',' || (select pg_catalog.max(oid) from pg_catalog.pg_type)::text`;

/** Where a group's BEGIN keeps its temporary-object marks (a custom setting, local to the transaction). */
const STARTING_MARKS = 'idempotent_jobs.group_marks';

/** A temporary object created since the group began, as an SQL condition. */
const NEW_TEMPORARY_OBJECT = `(pg_catalog.pg_my_temp_schema() <> 0 and (
     exists (select from pg_catalog.pg_class where oid > pg_catalog.split_part(pg_catalog.current_setting('${STARTING_MARKS}', true), ',', 1)::oid and relnamespace = pg_catalog.pg_my_temp_schema())
  or exists (select from pg_catalog.pg_proc where oid > pg_catalog.split_part(pg_catalog.current_setting('${STARTING_MARKS}', true), ',', 2)::oid and pronamespace = pg_catalog.pg_my_temp_schema())
  or exists (select from pg_catalog.pg_type where oid > pg_catalog.split_part(pg_catalog.current_setting('${STARTING_MARKS}', true), ',', 3)::oid and typnamespace = pg_catalog.pg_my_temp_schema())))`;

/**
 * Keeps the transaction's state as the group starts (after its BEGIN, in the same round trip),
 * for {@link checkGroupStateStatement} to compare with after each job.
 */
export function keepGroupStateStatement(names: readonly string[]): CompiledQuery {
  return prepared(
    CompiledQuery.raw(
      `select pg_catalog.set_config('${STARTING_STATE}', ${stateNow(names)}, true), pg_catalog.set_config('${STARTING_MARKS}', ${MARKS_NOW}, true)`,
      [],
    ),
  );
}

/**
 * Compares the transaction's state with what the group's BEGIN kept: when anything differs,
 * `group_state_differs` names what and raises {@link SETTING_CHANGED_STATE}, so the statements
 * after it never run; when nothing does, it returns no row, having called no function.
 * Sent after each job's statements, in the pipeline of the next job's first statement (or of the
 * group's COMMIT): no job runs under state a group-mate left, however it was made (a function, a
 * trigger), and a job that puts a value back after a group-mate changed it (A-B-A) hides
 * nothing, since every job is compared with the group's start, not only the last. A job that
 * lowered `synchronous_commit` could otherwise make its group-mates' commit non-durable; one
 * that set `app.tenant` could run them under another tenant's policies.
 *
 * Prepared statements are compared only with `preparedStatements` (they are the costliest part
 * to read): without it, {@link checkPreparedStatementsStatement} compares them once, at the
 * group's end. A prepared statement changes no group-mate's statement; it outlives the
 * transaction, so the group must not commit with one a job made, and it must be deallocated.
 */
export function checkGroupStateStatement(schema: string, names: readonly string[], options: { readonly preparedStatements: boolean }): CompiledQuery {
  const differs = options.preparedStatements
    ? `${stateNow(names)} is distinct from ${KEPT}`
    : `${CURSORS_NOW} || '|' || ${settingsNow(names)} is distinct from ${KEPT_CURSORS_AND_SETTINGS}`;
  return prepared(
    CompiledQuery.raw(
      `select ${pg.escapeIdentifier(schema)}.group_state_differs($1::text[])
        where ${differs}
           or ${NEW_TEMPORARY_OBJECT}`,
      [names],
    ),
  );
}

/**
 * Compares the number of prepared statements made by SQL with the group's start, once at the
 * group's end (after the last job's {@link checkGroupStateStatement}): when it differs,
 * `group_state_differs` deallocates those made since the group began and raises
 * {@link SETTING_CHANGED_STATE}. Which job made it is not known; the group rolls back.
 */
export function checkPreparedStatementsStatement(schema: string, names: readonly string[]): CompiledQuery {
  return prepared(
    CompiledQuery.raw(
      `select ${pg.escapeIdentifier(schema)}.group_state_differs($1::text[])
        where ${PREPARED_STATEMENTS_NOW} is distinct from ${KEPT_PREPARED_STATEMENTS}`,
      [names],
    ),
  );
}

/** DDL of `group_settings(names)` and `check_group_settings(names)` (migration 016; {@link groupStateFunctionsDdl} replaced the check). */
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


/**
 * DDL of `group_state_differs(names)`, which the check calls only when the state differs from
 * what the group's BEGIN kept (see {@link checkGroupStateStatement}): it names what differs and
 * raises {@link SETTING_CHANGED_STATE}. A prepared statement made since the group began is
 * deallocated first, as it would outlive the group's ROLLBACK.
 */
export function groupStateFunctionsDdl(schema: string) {
  return sql`
    create or replace function ${sql.id(schema, 'group_state_differs')}(p_names text[])
    returns void
    language plpgsql as $group_state_differs$
    declare
      v_kept text := pg_catalog.current_setting(${sql.lit(STARTING_STATE)}, true);
      v_counts text[] := pg_catalog.string_to_array(pg_catalog.split_part(v_kept, '|', 1), ',');
      v_settings text[] := pg_catalog.substr(v_kept, pg_catalog.strpos(v_kept, '|') + 1)::text[];
      v_marks text[] := pg_catalog.string_to_array(pg_catalog.current_setting(${sql.lit(STARTING_MARKS)}, true), ',');
      v_now text[] := array(select coalesce(pg_catalog.current_setting(n, true), '') from pg_catalog.unnest(p_names) with ordinality as t(n, o) order by o);
      v_temp oid := pg_catalog.pg_my_temp_schema();
      v_changed text[] := '{}';
      v_name text;
    begin
      if v_kept is null or v_marks is null then
        raise exception 'the state a group kept at its BEGIN is gone (a job reset %)', ${sql.lit(STARTING_STATE)}
          using errcode = ${sql.lit(SETTING_CHANGED_STATE)}, detail = 'group state';
      end if;
      v_changed := array(select p_names[i] from pg_catalog.generate_subscripts(p_names, 1) as i where v_now[i] is distinct from v_settings[i]);
      if v_temp <> 0 and (
           exists (select from pg_catalog.pg_class where oid > v_marks[1]::oid and relnamespace = v_temp)
        or exists (select from pg_catalog.pg_proc where oid > v_marks[2]::oid and pronamespace = v_temp)
        or exists (select from pg_catalog.pg_type where oid > v_marks[3]::oid and typnamespace = v_temp)) then
        v_changed := v_changed || 'a temporary object'::text;
      end if;
      if (select pg_catalog.count(*) from pg_catalog.pg_cursors where name <> '')::text <> v_counts[1] then
        v_changed := v_changed || 'an open cursor'::text;
      end if;
      if (select pg_catalog.count(*) from pg_catalog.pg_prepared_statements where from_sql)::text <> v_counts[2] then
        v_changed := v_changed || 'a prepared statement'::text;
        -- A prepared statement outlives the ROLLBACK that follows: those made since the group
        -- began go now, so that the job's group-mates do not meet them in their next group.
        for v_name in select name from pg_catalog.pg_prepared_statements where from_sql and prepare_time >= pg_catalog.now() loop
          execute pg_catalog.format('deallocate %I', v_name);
        end loop;
      end if;
      raise exception 'a job of this group left % in the shared transaction', coalesce(nullif(pg_catalog.array_to_string(v_changed, ', '), ''), 'a change to its state')
        using errcode = ${sql.lit(SETTING_CHANGED_STATE)}, detail = pg_catalog.array_to_string(v_changed, ',');
    end;
    $group_state_differs$`;
}
