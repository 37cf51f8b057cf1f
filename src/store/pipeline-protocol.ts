/**
 * The wire side of pipelines (see `pipeline.ts`): a node-postgres "submittable" that writes the
 * extended protocol's messages for several statements with one Sync, and reads the server's
 * answer back per statement. Apart from `pipeline.ts` because it names node-postgres's types,
 * which the package's public declaration files must never reach (`pg` ships no types of its
 * own, and `@types/pg` is only a development dependency).
 */
import { createRequire } from 'node:module';
import type { CompiledQuery, QueryResult } from 'kysely';
import pg from 'pg';
import { preparedNameOf, preparedOn, type PreparedOnConnection } from './named-statements.js';
import { PreparedStatementLostError, endsSession, isDuplicatePreparedStatement, isMissingPreparedStatement } from './pg-errors.js';
import { statementsOfPipeline, type PipelineReply } from './pipeline.js';

const require = createRequire(import.meta.url);
// node-postgres's own conversion of a JavaScript value to what it sends for a parameter, and
// its result class (row parsing with the client's type parsers): the pieces `pg.Query` uses.
const { prepareValue } = require('pg/lib/utils.js') as { prepareValue: (value: unknown) => unknown };
const PgResult = require('pg/lib/result.js') as new (rowMode: undefined, types: TypeParsers | undefined) => PgResultObject;

interface TypeParsers {
  getTypeParser(oid: number, format?: string): (value: unknown) => unknown;
}

interface PgResultObject {
  command: string | null;
  rowCount: number | null;
  rows: unknown[];
  addFields(fields: unknown[]): void;
  parseRow(fields: unknown[]): unknown;
  addRow(row: unknown): void;
  addCommandComplete(message: unknown): void;
}

/** How a pipeline is sent. */
export interface PipelineOptions {
  /**
   * Send the statements marked `prepared` (see `named-statements.ts`) as named prepared
   * statements, parsed once per connection. @defaultValue `false`
   */
  readonly named?: boolean;
}

/**
 * What a node-postgres client answers for a pipeline query ({@link runPipeline}), in the
 * `{ command, rowCount, rows }` shape that Kysely's Postgres connection reads.
 */
export async function answerPipelineQuery(client: pg.ClientBase, text: string, parameters: readonly unknown[], options: PipelineOptions = {}) {
  const statements = statementsOfPipeline({ sql: text, parameters });
  if (!statements) throw new Error('not a pipeline query');
  return { command: null, rowCount: null, rows: [await runPipeline(client, statements, options)] };
}

/**
 * One statement marked `prepared`, sent by its name (see `named-statements.ts`): what
 * node-postgres answers for a query, `{ command, rowCount, rows }`, or its error thrown.
 */
export async function answerNamedQuery(client: pg.ClientBase, text: string, parameters: readonly unknown[]) {
  let raw: PgResultObject | undefined;
  const reply = await runPipeline(client, [{ sql: text, parameters } as CompiledQuery], { named: true }, (result) => (raw = result));
  if (reply.failure) throw reply.failure.error;
  return { command: raw?.command ?? null, rowCount: raw?.rowCount ?? null, rows: raw?.rows ?? [] };
}

/**
 * Sends `statements` to `client` as one pipeline: one write, one Sync, one round trip. Resolves
 * with what each did (see {@link PipelineReply}); rejects only when the connection failed,
 * when what ran is unknown.
 */
export function runPipeline(
  client: pg.ClientBase,
  statements: readonly CompiledQuery[],
  options: PipelineOptions = {},
  onResult?: (result: PgResultObject) => void,
): Promise<PipelineReply> {
  // Values are converted before anything is written: one that cannot be (a circular object,
  // say) fails its statement, and only the statements before it are sent.
  const prepared: Array<{ readonly text: string; readonly values: unknown[] }> = [];
  let refused: { index: number; error: unknown } | undefined;
  for (const [index, statement] of statements.entries()) {
    try {
      prepared.push({ text: statement.sql, values: statement.parameters.map((value) => prepareValue(value)) });
    } catch (error) {
      refused = { index, error };
      break;
    }
  }
  if (prepared.length === 0) return Promise.resolve({ results: [], ...(refused ? { failure: refused } : {}) });
  return new Promise<PipelineReply>((resolve, reject) => {
    const submittable = new PipelinedStatements(prepared, client as unknown as TypeParsers, refused, resolve, reject, options.named ?? false, onResult);
    client.query(submittable as unknown as pg.QueryConfig);
  });
}

/**
 * A node-postgres "submittable" (as pg-cursor is one): the client hands it the connection when
 * the connection is ready, and then every message of the server's reply, until ReadyForQuery
 * (or an ErrorResponse, after which the client forgets it).
 */
class PipelinedStatements {
  readonly #statements: ReadonlyArray<{ readonly text: string; readonly values: unknown[] }>;
  readonly #types: TypeParsers;
  readonly #refused: { index: number; error: unknown } | undefined;
  readonly #resolve: (reply: PipelineReply) => void;
  readonly #reject: (error: unknown) => void;
  readonly #results: Array<QueryResult<unknown>> = [];
  #current: PgResultObject | undefined;
  /**
   * A row the type parsers could not read (a custom parser threw), and its statement: reported
   * as that statement's failure once the server has answered everything, as node-postgres
   * reports it for one query. Unlike a server-side failure, the statements after it did run;
   * inside a transaction the caller rolls them back with the rest.
   */
  #rowError: { readonly index: number; readonly error: unknown } | undefined;
  #done = false;
  readonly #named: boolean;
  readonly #onResult: ((result: PgResultObject) => void) | undefined;
  /** Per statement sent: its name (or '' unnamed) and whether its Parse went in this pipeline. */
  readonly #sent: Array<{ readonly name: string; readonly parsedHere: boolean }> = [];
  /** The connection's prepared names, once the statements are sent with names. */
  #prepared: PreparedOnConnection | undefined;

  constructor(
    statements: ReadonlyArray<{ readonly text: string; readonly values: unknown[] }>,
    types: TypeParsers,
    refused: { index: number; error: unknown } | undefined,
    resolve: (reply: PipelineReply) => void,
    reject: (error: unknown) => void,
    named: boolean,
    onResult: ((result: PgResultObject) => void) | undefined,
  ) {
    this.#statements = statements;
    this.#types = types;
    this.#refused = refused;
    this.#resolve = resolve;
    this.#reject = reject;
    this.#named = named;
    this.#onResult = onResult;
  }

  /** The statements' texts, one after another (for logs and for counting round trips in tests). */
  get text(): string {
    return this.#statements.map((statement) => statement.text).join(';\n');
  }

  submit(connection: PgConnection): null {
    // Corked, the messages leave in one write (as node-postgres does for one extended query).
    connection.stream.cork?.();
    if (this.#named) this.#prepared = preparedOn(connection);
    // A name this pipeline parses already (a group's end sends one completion per job, the same
    // text each): parsed once, as a second Parse of the name would fail ("already exists").
    const parsedInThisPipeline = new Set<string>();
    try {
      for (const { text, values } of this.#statements) {
        const name = (this.#prepared && preparedNameOf(text)) || '';
        const parsedHere = name === '' || (!this.#prepared!.parsed.has(name) && !parsedInThisPipeline.has(name));
        if (name !== '' && parsedHere) parsedInThisPipeline.add(name);
        if (parsedHere) {
          // A Parse of this name that failed with its statement may have created it: close it first.
          if (name !== '' && this.#prepared!.uncertain.has(name)) connection.close({ type: 'S', name });
          connection.parse({ text, name, types: [] });
        }
        this.#sent.push({ name, parsedHere });
        connection.bind({ portal: '', statement: name, values, binary: false });
        connection.describe({ type: 'P', name: '' });
        connection.execute({ portal: '', rows: 0 });
      }
      connection.sync();
    } finally {
      connection.stream.uncork?.();
    }
    return null;
  }

  handleRowDescription(message: { fields: unknown[] }): void {
    this.#result().addFields(message.fields);
  }

  handleDataRow(message: { fields: unknown[] }): void {
    const result = this.#result();
    try {
      result.addRow(result.parseRow(message.fields));
    } catch (error) {
      this.#rowError ??= { index: this.#results.length, error };
    }
  }

  handleCommandComplete(message: unknown): void {
    const result = this.#result();
    result.addCommandComplete(message);
    this.#current = undefined;
    this.#noteParsed(this.#results.length);
    this.#results.push(asKyselyResult(result));
    this.#onResult?.(result);
  }

  handleEmptyQuery(): void {
    this.#current = undefined;
    this.#noteParsed(this.#results.length);
    this.#results.push({ rows: [] });
  }

  handleError(error: unknown): void {
    // An ErrorResponse that leaves the session open is the failed statement's: the one after the
    // last that completed, or the last one when all had (the implicit transaction's commit at
    // the Sync failed, undoing them). One that ends the session (FATAL: a terminated backend, a
    // shutdown) may come at any point, even after the COMMIT completed; like the socket closing,
    // it leaves unknown what became of the transaction.
    if (error instanceof pg.DatabaseError && !endsSession(error)) {
      const index = Math.min(this.#results.length, this.#statements.length - 1);
      this.#finish({ results: this.#results.slice(0, index), failure: { index, error: this.#noteFailed(index, error) } });
    } else this.#fail(error);
  }

  /** Statement `index` completed: a Parse of its name sent here certainly took. */
  #noteParsed(index: number): void {
    const sent = this.#sent[index];
    if (!sent || sent.name === '' || !sent.parsedHere) return;
    this.#prepared!.parsed.add(sent.name);
    this.#prepared!.uncertain.delete(sent.name);
  }

  /**
   * Statement `index` failed with `error`: a Parse of its name sent here may or may not have
   * taken, so its next Parse goes after a Close. A name the server connection did not have (a
   * Bind without Parse), or had already (a Parse), says that it does not hold what this
   * connection prepared: the failure becomes a {@link PreparedStatementLostError} (nothing of
   * the statement ran).
   */
  #noteFailed(index: number, error: unknown): unknown {
    const sent = this.#sent[index];
    // Completed already (the implicit transaction's commit at the Sync failed): noted as parsed.
    if (!sent || sent.name === '' || index < this.#results.length) return error;
    this.#prepared!.parsed.delete(sent.name);
    this.#prepared!.uncertain.add(sent.name);
    // Its Parse found the name taken (another client's, on a server connection a pooler shares),
    // or its Bind found it gone (a pooler moved this client, or a job deallocated it).
    const mismatch = sent.parsedHere ? isDuplicatePreparedStatement(error) : isMissingPreparedStatement(error);
    return mismatch ? new PreparedStatementLostError(sent.name, { cause: error }) : error;
  }

  handleReadyForQuery(): void {
    const failure = this.#rowError ?? this.#refused;
    this.#finish({ results: failure ? this.#results.slice(0, failure.index) : this.#results, ...(failure ? { failure } : {}) });
  }

  handlePortalSuspended(): void {
    // Never asked for: every Execute runs its portal to completion.
  }

  handleCopyInResponse(connection: PgConnection): void {
    // COPY … FROM STDIN has no data to read here: it fails as its statement's error.
    connection.sendCopyFail('COPY FROM STDIN is not supported in a pipeline');
  }

  handleCopyData(): void {
    // COPY … TO STDOUT: the data is not kept.
  }

  #result(): PgResultObject {
    this.#current ??= new PgResult(undefined, this.#types);
    return this.#current;
  }

  #finish(reply: PipelineReply): void {
    if (this.#done) return;
    this.#done = true;
    this.#resolve(reply);
  }

  #fail(error: unknown): void {
    if (this.#done) return;
    this.#done = true;
    this.#reject(error);
  }
}

/** The parts of node-postgres's `Connection` a submittable writes to. */
interface PgConnection {
  readonly stream: { cork?: () => void; uncork?: () => void };
  parse(message: { text: string; name: string; types: number[] }): void;
  bind(message: { portal: string; statement: string; values: unknown[]; binary: boolean }): void;
  describe(message: { type: 'P' | 'S'; name: string }): void;
  close(message: { type: 'P' | 'S'; name: string }): void;
  execute(message: { portal: string; rows: number }): void;
  sync(): void;
  sendCopyFail(message: string): void;
}

/** A statement's result as Kysely's Postgres connection reports it (`PostgresConnection.executeQuery`). */
function asKyselyResult(result: PgResultObject): QueryResult<unknown> {
  const { command, rowCount, rows } = result;
  if (command === 'ROLLBACK' || command === 'COMMIT') return { rows: [{ command }] };
  const affects = command === 'INSERT' || command === 'UPDATE' || command === 'DELETE' || command === 'MERGE';
  return { numAffectedRows: affects ? BigInt(rowCount ?? 0) : undefined, rows };
}
