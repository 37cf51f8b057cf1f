import { describeError as describe } from '../describe-error.js';
import { ConfigError } from '../errors.js';
import { isLoginRefused, isMissingRelation, missingDatabaseOf } from '../store/missing-objects.js';
import { transientStoreFault } from '../store/pg-errors.js';

/** Where a process or command was told to find its tables: the variable, its URL and the schema. */
export interface DatabaseSetting {
  /** The variable that holds the URL, e.g. `'DATABASE_URL'`. */
  readonly variable: string;
  readonly url: string;
  /** The schema of the idempotency tables (`SCHEMA`). */
  readonly schema: string;
}

/** Postgres did not answer a command: the message names the variable that holds its URL. Exit code 1. */
export class DatabaseUnreachableError extends Error {
  constructor(message: string, options: { cause: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A URL as it may be shown: the password replaced by `***`. */
export function redactedUrl(url: string): string {
  if (!URL.canParse(url)) return url;
  const parsed = new URL(url);
  if (parsed.password) parsed.password = '***';
  return parsed.toString();
}

/**
 * An error that says what to do, in place of a driver's error that names neither the variable
 * nor the next step: a database that does not exist (create it), a schema without the tables
 * (migrate it), a login refused, a server that does not answer (each naming the variable and its
 * URL, password hidden). The set-up errors are {@link ConfigError}s (exit code 2), an unanswered
 * server a {@link DatabaseUnreachableError} (exit code 1); any other error is returned as it is.
 */
export function explainDatabaseError(error: unknown, setting: DatabaseSetting): unknown {
  const where = `${setting.variable} (${redactedUrl(setting.url)})`;
  const database = missingDatabaseOf(error);
  if (database !== undefined) {
    return new ConfigError(
      `Postgres has no database "${database}", which ${where} names. Create it (${createdbCommand(setting.url, database)}), or point ${setting.variable} at a database that exists.`,
      { cause: error },
    );
  }
  if (isMissingRelation(error)) return notMigratedError(setting, `${describe(error)}`, error);
  if (isLoginRefused(error)) {
    return new ConfigError(`Postgres refused the login of ${where}: ${describe(error)}. Fix the user or password in ${setting.variable}.`, { cause: error });
  }
  if (transientStoreFault(error) === 'connection') {
    return new DatabaseUnreachableError(`Postgres at ${where} did not answer: ${describe(error)}. Check that the server is up and ${setting.variable} is right.`, { cause: error });
  }
  return error;
}

/**
 * The schema has no idempotency tables (found missing, or a statement failed on them): the
 * message says how to create them. A {@link ConfigError} (exit code 2).
 */
export function notMigratedError(setting: DatabaseSetting, found = `no ${setting.schema}.idempotency_keys table`, cause?: unknown): ConfigError {
  return new ConfigError(
    `Schema "${setting.schema}" in ${setting.variable} (${redactedUrl(setting.url)}) has no idempotency tables (${found}). Create them with ` +
      `\`idempotent-jobs migrate\` (same ${setting.variable} and SCHEMA), or start a worker with MIGRATE=true (the default); or set SCHEMA to the schema your workers use.`,
    { cause },
  );
}

/** The shell command that creates `database` on the server of `url`. */
function createdbCommand(url: string, database: string): string {
  if (!URL.canParse(url)) return `createdb ${database}`;
  const { hostname, port, username } = new URL(url);
  const options = [hostname && `-h ${hostname}`, port && `-p ${port}`, username && `-U ${decodeURIComponent(username)}`].filter(Boolean).join(' ');
  return `createdb ${options ? `${options} ` : ''}${database}`;
}
