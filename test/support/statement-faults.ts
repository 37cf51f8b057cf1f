/**
 * A store fault at a chosen statement: a Kysely instance over real Postgres, built as
 * `createPostgresDb` builds its own (pipelines, named statements, sessions pinned to read
 * committed), whose every statement is counted, and whose nth statement can be made to fail
 * before it runs, or to lose its reply after it ran. The faults are real server-side events, not
 * mocks, so Postgres keeps or undoes exactly what it would:
 *
 * - `{ kind: 'cut', when: 'before' }`: the connection ends just before the statement (the
 *   backend terminates itself, `pg_terminate_backend(pg_backend_pid())`): the statement never
 *   ran, an open transaction is rolled back, and the caller gets the driver's real error (57P01
 *   FATAL, or "Connection terminated unexpectedly");
 * - `{ kind: 'cut', when: 'after' }`: the statement ran, and the connection ended before its
 *   reply was read. When it was the last statement of its round trip, the round trip completed
 *   (an autocommit statement, or a COMMIT, committed: the ambiguous commit); in the middle of a
 *   pipeline, the rest of the pipeline never ran and its implicit transaction rolled back;
 * - `{ kind: 'error', sqlState }`: Postgres raises that SQLSTATE in place of the statement
 *   (53100 disk full, 40001 serialization failure, 57014 statement timeout…), a real
 *   `DatabaseError` on an intact connection: the statement did nothing, its transaction is
 *   aborted, and in a pipeline the statements after it are skipped.
 *
 * Each statement of a pipeline counts as one (BEGIN, the statement, the completion, COMMIT), so
 * "every statement of the protocol" means every one Postgres would see. The usual use: run a
 * scenario once with {@link StatementFaults.statementsOf} to list its statements, then run it
 * again once per statement and per fault, checking the invariants after each.
 *
 * @example
 * ```ts
 * const faults = StatementFaults.open({ connectionString: env.databaseUrl, applicationName: 'ij-faults' });
 * const keys = new IdempotencyKeys({ db: faults.db, schema: env.schema });
 * const { statements } = await faults.statementsOf(() => scenario(keys, 'dry-run'));
 * for (let nth = 1; nth <= statements.length; nth++) {
 *   for (const fault of [{ kind: 'cut', when: 'before' }, { kind: 'cut', when: 'after' }] as const) {
 *     faults.arm({ nth, fault });
 *     await scenario(keys, `key-${nth}-${fault.when}`).catch(() => {});
 *     faults.disarm();
 *     // …check that no effect committed twice and no key is stuck
 *   }
 * }
 * await faults.close();
 * ```
 */
import { Kysely, PostgresDialect, type CompiledQuery, type PostgresPool, type PostgresPoolClient } from 'kysely';
import pg from 'pg';
import { READ_COMMITTED_SESSION } from '../../src/store/create-postgres-db.js';
import { markPipelining, pipelineQuery, statementsOfPipeline, type PipelineReply } from '../../src/store/pipeline.js';
import { pipeliningPool } from '../../src/store/pipelining-pool.js';

/** What becomes of the statement a fault is armed at (see the module's comment). */
export type StatementFault =
  | {
      readonly kind: 'cut';
      /** `before`: the statement never runs; `after`: it runs, and its reply is lost. */
      readonly when: 'before' | 'after';
    }
  | {
      readonly kind: 'error';
      /** The SQLSTATE Postgres raises in place of the statement, e.g. `'53100'` (disk full). */
      readonly sqlState: string;
      /** The error's message. @defaultValue one naming the SQLSTATE and the statement's number */
      readonly message?: string;
    };

/** Where to inject a fault: see {@link StatementFaults.arm}. */
export interface StatementFaultPlan {
  /** The statement, counted from 1 among those sent after {@link StatementFaults.arm} that `match` accepts. */
  readonly nth: number;
  readonly fault: StatementFault;
  /** Only statements whose text this matches are counted (and faulted). @defaultValue every statement */
  readonly match?: RegExp;
  /**
   * How many matching statements from the nth on get the fault, one after another (one per round
   * trip: the rest of a faulted round trip is not sent). `Infinity`: every one until
   * {@link StatementFaults.disarm}, as a disk that stays full. @defaultValue `1`
   */
  readonly times?: number;
}

/** One statement as Postgres was sent it (or would have been, for one a fault cut off). */
export interface SentStatement {
  /** Its number among every statement since the instance opened, from 1. */
  readonly index: number;
  /** Its text, whitespace collapsed, cut to 120 characters: enough to tell which statement it was. */
  readonly text: string;
  /** The round trip it went in (statements of one pipeline share it). */
  readonly roundTrip: number;
}

/** A fault that was injected, and where. */
export interface FiredFault {
  readonly statement: SentStatement;
  readonly fault: StatementFault;
}

/** Options of {@link StatementFaults.open}. */
export interface StatementFaultsOptions {
  readonly connectionString: string;
  /** @defaultValue `10` */
  readonly maxConnections?: number;
  /** Shown in `pg_stat_activity`. @defaultValue `'ij-statement-faults'` */
  readonly applicationName?: string;
  /** As `createPostgresDb`'s: false behind a pooler that keeps no prepared statements. @defaultValue `true` */
  readonly preparedStatements?: boolean;
}

const TERMINATE = 'select pg_terminate_backend(pg_backend_pid())';

/** A Kysely instance whose statements are counted and can be faulted one by one (see the module's comment). */
export class StatementFaults {
  /** The instance to give the code under test (a store, `IdempotencyKeys`, a worker). */
  readonly db: Kysely<any>;
  readonly #sent: SentStatement[] = [];
  readonly #fired: FiredFault[] = [];
  #roundTrips = 0;
  #plan: { readonly plan: StatementFaultPlan; matched: number; left: number } | undefined;

  private constructor(pool: PostgresPool) {
    this.db = markPipelining(new Kysely<any>({ dialect: new PostgresDialect({ pool: this.#faulting(pool) }) }));
  }

  /** Opens a pool on `connectionString`, as `createPostgresDb` would, with nothing armed. Close it with {@link close}. */
  static open(options: StatementFaultsOptions): StatementFaults {
    const pool = new pg.Pool({
      connectionString: options.connectionString,
      options: READ_COMMITTED_SESSION,
      max: options.maxConnections ?? 10,
      application_name: options.applicationName ?? 'ij-statement-faults',
    });
    // A terminated backend must not crash the process (see createPostgresDb).
    pool.on('error', () => {});
    pool.on('connect', (client) => client.on('error', () => {}));
    return new StatementFaults(pipeliningPool(pool, options.preparedStatements ?? true));
  }

  /** Every statement sent since the instance opened, in order. */
  get sent(): readonly SentStatement[] {
    return this.#sent;
  }

  /** The faults injected since the instance opened, in order. */
  get fired(): readonly FiredFault[] {
    return this.#fired;
  }

  /**
   * Arms one fault (replacing any armed before): counting from now, the `nth` statement that
   * `plan.match` accepts gets `plan.fault`, and so do the next ones up to `plan.times`.
   */
  arm(plan: StatementFaultPlan): void {
    if (!Number.isInteger(plan.nth) || plan.nth < 1) throw new Error(`nth must be a whole number from 1, not ${plan.nth}`);
    if (plan.fault.kind === 'error' && !/^[0-9A-Z]{5}$/.test(plan.fault.sqlState)) throw new Error(`not a SQLSTATE: ${plan.fault.sqlState}`);
    this.#plan = { plan, matched: 0, left: plan.times ?? 1 };
  }

  /** Disarms the fault: every statement runs as sent. */
  disarm(): void {
    this.#plan = undefined;
  }

  /** True while an armed fault has injections left. */
  get armed(): boolean {
    return this.#plan !== undefined && this.#plan.left > 0;
  }

  /** Runs `fn` and returns what it returned (or threw) with the statements it sent. Nothing is armed or disarmed. */
  async statementsOf<T>(fn: () => Promise<T>): Promise<{ readonly result: PromiseSettledResult<T>; readonly statements: SentStatement[] }> {
    const first = this.#sent.length;
    const [result] = await Promise.allSettled([fn()]);
    return { result: result!, statements: this.#sent.slice(first) };
  }

  /** Closes the pool. */
  async close(): Promise<void> {
    await this.db.destroy();
  }

  /** `pool`, whose clients count each statement and apply the armed fault. */
  #faulting(pool: PostgresPool): PostgresPool {
    return {
      connect: async (): Promise<PostgresPoolClient> => {
        const client = await pool.connect();
        let cut = false;
        return {
          query: ((text: unknown, parameters?: readonly unknown[]) => {
            if (typeof text !== 'string') return client.query(text as any);
            return this.#send(client, text, parameters ?? [], () => (cut = true));
          }) as PostgresPoolClient['query'],
          // A session this ended is never lent out again.
          release: (destroy?: boolean) => client.release(destroy || cut),
        };
      },
      end: () => pool.end(),
    };
  }

  async #send(client: PostgresPoolClient, text: string, parameters: readonly unknown[], onCut: () => void): Promise<any> {
    const pipelined = statementsOfPipeline({ sql: text, parameters });
    const statements: readonly CompiledQuery[] = pipelined ?? [{ sql: text, parameters } as unknown as CompiledQuery];
    const roundTrip = ++this.#roundTrips;
    let faultAt: number | undefined;
    let fault: StatementFault | undefined;
    for (const [position, statement] of statements.entries()) {
      const sent: SentStatement = { index: this.#sent.length + 1, text: shortText(statement.sql), roundTrip };
      this.#sent.push(sent);
      fault = this.#faultFor(statement.sql);
      if (fault) {
        faultAt = position;
        this.#fired.push({ statement: sent, fault });
        break;
      }
    }
    const asSent = (list: readonly CompiledQuery[]) =>
      pipelined ? client.query(pipelineQuery(list).sql, pipelineQuery(list).parameters) : client.query(list[0]!.sql, list[0]!.parameters);
    if (faultAt === undefined || fault === undefined) return asSent(statements);

    const before = statements.slice(0, faultAt);
    if (fault.kind === 'error') return asSent([...before, raising(fault, this.#sent.length)]);
    onCut();
    if (fault.when === 'after' && faultAt === statements.length - 1) {
      // The whole round trip ran (a last COMMIT committed); only its reply is lost.
      await asSent(statements);
      throw await this.#terminate(client, () => client.query(TERMINATE, []));
    }
    const ran = fault.when === 'after' ? statements.slice(0, faultAt + 1) : before;
    const terminate = { sql: TERMINATE, parameters: [] } as unknown as CompiledQuery;
    // Sent with the statements that ran, so the session ends before the round trip's end: what a
    // pipeline's implicit transaction held is rolled back, as when a link fails there.
    throw await this.#terminate(client, () => asSent([...ran, terminate]));
  }

  /** The armed fault's, when `sql` is the statement it falls on (one more counted). */
  #faultFor(sql: string): StatementFault | undefined {
    const armed = this.#plan;
    if (!armed || armed.left <= 0) return undefined;
    if (armed.plan.match && !armed.plan.match.test(sql)) return undefined;
    armed.matched++;
    if (armed.matched < armed.plan.nth) return undefined;
    armed.left--;
    return armed.plan.fault;
  }

  /** Sends a round trip that ends the session, and returns the error the driver gave for it. */
  async #terminate(client: PostgresPoolClient, send: () => Promise<unknown>): Promise<unknown> {
    let answer: unknown;
    try {
      answer = await send();
    } catch (error) {
      return error;
    }
    const failure = (answer as { rows?: PipelineReply[] }).rows?.[0]?.failure;
    if (failure) return failure.error;
    // The backend ended the session at its next interrupt check; the next statement sees it.
    return client.query('select 1', []).then(
      () => new Error('the session survived pg_terminate_backend of its own backend'),
      (error: unknown) => error,
    );
  }
}

/** A statement that raises `fault`'s SQLSTATE on the server. */
function raising(fault: StatementFault & { kind: 'error' }, index: number): CompiledQuery {
  const message = (fault.message ?? `injected fault ${fault.sqlState} at statement ${index}`).replaceAll("'", "''").replaceAll('$', '');
  return { sql: `do $fault$ begin raise exception using errcode = '${fault.sqlState}', message = '${message}'; end $fault$`, parameters: [] } as unknown as CompiledQuery;
}

function shortText(sql: string): string {
  const text = sql.replace(/\s+/g, ' ').trim();
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}
