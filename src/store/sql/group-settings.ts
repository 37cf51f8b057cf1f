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
      select ${FUNCTION_BODY} as text
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
 * The functions of the library's own schema (`migrate`), which {@link codeCanLeaveState} does not
 * read: they run in the store's own statements, and what they set is local to those and named
 * `idempotent_jobs.*`, which no check watches. (One runs in a job's transaction, a group's too:
 * the take of concurrency slots, which reads and writes only the library's own tables, locks and
 * settings.) A migration that adds a function adds its name here
 * (`test/group-commit-state.test.ts` compares this list with a migrated schema's functions).
 */
export const LIBRARY_FUNCTIONS: readonly string[] = [
  'acquire_concurrency_slot',
  'check_group_settings',
  'claim_key',
  'claim_keys',
  'claim_new_key',
  'claim_new_keys',
  'coalesce_arrive',
  'complete_key',
  'concurrency_slot_lock_key',
  'extend_lease',
  'group_settings',
  'group_state_differs',
  'insert_completed_keys',
  'record_step',
  'refuse_tombstoned_key',
  'start_step',
  'store_fast_path_result',
  'take_concurrency_slots_in_shared_transaction',
  'take_concurrency_slots_in_transaction',
  'wake_concurrency_waiters',
];

/**
 * A function's body as text: `prosrc`, or, for a body in the SQL standard's form (`RETURN …`,
 * `BEGIN ATOMIC … END`, Postgres 14 and later: `prosrc` is empty and the body is parsed into
 * `prosqlbody`), the function's definition deparsed. Read through `to_jsonb`, so that the same
 * statement runs where `prosqlbody` does not exist.
 */
const FUNCTION_BODY = sql`(case when pg_catalog.to_jsonb(p) ->> 'prosqlbody' is not null then pg_catalog.pg_get_functiondef(p.oid) else p.prosrc end)`;

/**
 * Words in the body of a SQL or PL/pgSQL function that can leave state in its caller's
 * transaction: a setting (`set_config`, a `SET`, `RESET` or `DISCARD` statement, an update of
 * `pg_settings`), a temporary object, an open cursor (`OPEN`, a `CURSOR` or `refcursor`), a
 * prepared statement, or SQL run from a string (`EXECUTE`; `query_to_xml`, `ts_stat` and
 * `ts_rewrite`, which run a query given as text), which can do any of these. Read as a regular
 * expression of Postgres, without case, as whole words anywhere in the body: `SET` counts in an
 * `UPDATE … SET` too, and a word in a comment or a name (a column `temp`) counts, which errs on
 * the side of checking after each job; telling a `SET` statement from an `UPDATE`'s past comments
 * and labels is what a parser does, not a pattern.
 */
const STATE_WORDS =
  '\\m(set_config|set|reset|discard|pg_settings|pg_temp|temp|temporary|cursor|refcursor|open|prepare|deallocate|execute|' +
  'query_to_xml|query_to_xmlschema|query_to_xml_and_xmlschema|ts_stat|ts_rewrite)\\M';

/** What an expression stored outside a function (a view's, a rule's, a default, a check, a trigger's WHEN, a policy) must not call: {@link STATE_WORDS}' functions and `pg_settings` (its update rule calls `set_config`). */
const STATE_CALLS = '\\m(set_config|pg_settings|query_to_xml|query_to_xmlschema|query_to_xml_and_xmlschema|ts_stat|ts_rewrite)\\M';

/**
 * Whether code stored in this database could leave state in a job's transaction behind the
 * statement screen's back (see `statement-screen.ts`, which reads only the text a job sends):
 * - a function or procedure outside the system's schemas written in a language whose code is
 *   not read here (PL/Python, PL/v8, PL/Perl, … and `internal`, which names a built-in);
 * - a SQL or PL/pgSQL body (triggers' included) with one of {@link STATE_WORDS};
 * - a view, rule, column default, check constraint (a domain's included), trigger condition or
 *   row-level security policy that calls one of {@link STATE_CALLS}.
 *
 * *Why it matters:* when nothing can, every change of state a job could make is in its own text,
 * which the screen refuses before it runs, so group commit compares the transaction's state at
 * the group's end only, not after each job, which costs a statement per job (see
 * `GroupCommitter`). The read errs on the side of "can": any function that updates a table
 * (`UPDATE … SET`) counts. The library's own functions are not read ({@link LIBRARY_FUNCTIONS});
 * code written in C (an extension's) is trusted not to. What this read misses (C code that does,
 * code created after it: the store reads it again every minute) is still found at the group's
 * end: the group runs again, each job alone, and every later group is checked after each job.
 */
export async function codeCanLeaveState(db: Kysely<any>): Promise<boolean> {
  const { rows } = await sql<{ found: boolean }>`
    with library_schemas as (
      select c.relnamespace as oid
        from pg_catalog.pg_class as c
       where c.relname = 'idempotency_keys' and c.relkind in ('r', 'p')
         and exists (select from pg_catalog.pg_class as m where m.relnamespace = c.relnamespace and m.relname = 'idempotent_jobs_migration')
    ), user_namespaces as (
      select n.oid from pg_catalog.pg_namespace as n
       where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg\\_toast%'
    ), user_functions as (
      select l.lanname, case when l.lanname in ('sql', 'plpgsql') then ${FUNCTION_BODY} else '' end as body
        from pg_catalog.pg_proc as p
        join pg_catalog.pg_language as l on l.oid = p.prolang
       where p.pronamespace in (select oid from user_namespaces)
         and p.prokind in ('f', 'p')
         and not (p.pronamespace in (select oid from library_schemas) and p.proname = any(${LIBRARY_FUNCTIONS}::text[]))
    ), user_relations as (
      select c.oid from pg_catalog.pg_class as c where c.relnamespace in (select oid from user_namespaces)
    ), expressions as (
      select pg_catalog.pg_get_ruledef(r.oid) as text from pg_catalog.pg_rewrite as r where r.ev_class in (select oid from user_relations)
      union all
      select pg_catalog.pg_get_expr(d.adbin, d.adrelid) from pg_catalog.pg_attrdef as d where d.adrelid in (select oid from user_relations)
      union all
      select pg_catalog.pg_get_constraintdef(k.oid) from pg_catalog.pg_constraint as k
       where k.contype = 'c' and k.connamespace in (select oid from user_namespaces)
      union all
      select pg_catalog.pg_get_triggerdef(t.oid) from pg_catalog.pg_trigger as t
       where not t.tgisinternal and t.tgqual is not null and t.tgrelid in (select oid from user_relations)
      union all
      select coalesce(pg_catalog.pg_get_expr(y.polqual, y.polrelid), '') || ' ' || coalesce(pg_catalog.pg_get_expr(y.polwithcheck, y.polrelid), '') from pg_catalog.pg_policy as y
    )
    select exists (select from user_functions where lanname not in ('sql', 'plpgsql', 'c'))
        or exists (select from user_functions where lanname in ('sql', 'plpgsql') and body ~* ${STATE_WORDS})
        or exists (select from expressions where text ~* ${STATE_CALLS}) as found`.execute(db);
  return rows[0]!.found;
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
 *
 * A session without a temporary schema as the group begins (a worker's, unless a job ran alone
 * made a temporary object on it) has no temporary object older than the group: every one the
 * check finds is new, so the marks are 0 and the three catalogs are not read. Reading them was
 * most of the keeping's cost (about 15 of 30 µs of the server's time per group).
 */
const MARKS_NOW = `case when pg_catalog.pg_my_temp_schema() = 0 then '0,0,0'
  else (select pg_catalog.max(oid) from pg_catalog.pg_class)::text
  || ',' || (select pg_catalog.max(oid) from pg_catalog.pg_proc)::text
  || ',' || (select pg_catalog.max(oid) from pg_catalog.pg_type)::text end`;

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
