/**
 * What a statement of a job's own (not the store's) does to the transaction it runs in, read from
 * its text. The store runs a job's effect on a transaction whose BEGIN and COMMIT are its own,
 * and group commit runs several jobs' effects on one transaction; both need to know a statement
 * that would end that transaction, or leave state behind for the statements after it.
 *
 * The text is read by a small lexer that skips what is not code: quoted strings (with `''` and,
 * in `E'…'`, backslash escapes), quoted identifiers, dollar-quoted strings and comments (block
 * comments nest). It looks at each statement's first words, at calls of `set_config` and of the
 * session-level advisory lock functions, and at savepoint commands; what a function does inside
 * is out of its sight (group commit compares the transaction's state after each job, see
 * `sql/group-settings.ts`).
 */

/**
 * - `'ends-transaction'`: BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK (but not ROLLBACK TO
 *   a savepoint), ABORT, PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED: would end (or try to
 *   begin) the transaction that must commit the effect with its key. Never allowed.
 * - `'leaves-state'`: SET and RESET of any kind (`SET LOCAL`, `SET ROLE`, `SET CONSTRAINTS`,
 *   `SET TRANSACTION`, …), `set_config(…)`, CREATE TEMP …, CREATE … `pg_temp.`…, DISCARD,
 *   LISTEN, UNLISTEN, LOAD, PREPARE, DEALLOCATE, a call of a session-level advisory lock function
 *   (`pg_advisory_lock`, `pg_try_advisory_lock`, their `_shared` forms, `pg_advisory_unlock…`):
 *   changes what later statements of the same transaction or session see. Allowed in a job's own
 *   transaction; a job that sends one runs alone, never in a group.
 * - `'plain'`: anything else.
 */
export type StatementEffect = 'ends-transaction' | 'leaves-state' | 'plain';

/** How a query's text reads: the strongest effect of its statements, and how many statements it holds. */
export interface ScreenedText {
  readonly effect: StatementEffect;
  /** Statements in the text (empty ones, such as a lone `;`, not counted). */
  readonly statements: number;
  /** Its SAVEPOINT, RELEASE and ROLLBACK TO commands, in order (a group keeps each job's own apart). */
  readonly savepoints: readonly SavepointCommand[];
}

/**
 * A savepoint command: `open` (SAVEPOINT name), `release` (RELEASE [SAVEPOINT] name: that
 * savepoint and those opened after it end), `rollback-to` (ROLLBACK TO [SAVEPOINT] name: those
 * opened after it end, it stays). The name as Postgres reads it (unquoted: lower case).
 */
export interface SavepointCommand {
  readonly op: 'open' | 'release' | 'rollback-to';
  readonly name: string;
}

const ENDS_TRANSACTION = new Set(['begin', 'start', 'commit', 'end', 'abort']);
const LEAVES_STATE = new Set(['set', 'reset', 'discard', 'listen', 'unlisten', 'load', 'deallocate']);
/** Functions whose call changes the session for the statements after it. */
const LEAVES_STATE_CALLS = new Set([
  'set_config',
  'pg_advisory_lock',
  'pg_advisory_lock_shared',
  'pg_try_advisory_lock',
  'pg_try_advisory_lock_shared',
  'pg_advisory_unlock',
  'pg_advisory_unlock_shared',
  'pg_advisory_unlock_all',
]);

/** Texts already read: a job's statements repeat (Kysely compiles the same text each time). */
const screened = new Map<string, ScreenedText>();
const SCREENED_KEPT = 2048;

/** Reads `text` (see {@link StatementEffect}); remembers the answer for the same text. */
export function screenStatement(text: string): ScreenedText {
  let answer = screened.get(text);
  if (answer === undefined) {
    answer = readText(text);
    if (screened.size >= SCREENED_KEPT) screened.clear();
    screened.set(text, answer);
  }
  return answer;
}

function readText(text: string): ScreenedText {
  let effect: StatementEffect = 'plain';
  let statements = 0;
  const savepoints: SavepointCommand[] = [];
  for (const statement of lexStatements(text)) {
    statements++;
    const own = effectOf(statement);
    if (own === 'ends-transaction' || (own === 'leaves-state' && effect === 'plain')) effect = own;
    const savepoint = savepointOf(statement.words);
    if (savepoint) savepoints.push(savepoint);
  }
  return { effect, statements, savepoints };
}

/**
 * One statement as the lexer saw it: its first words (lower case; a quoted identifier as `"`
 * and its text, so that it never reads as a keyword), whether it calls a function that leaves
 * state, and whether it names the temporary schema (`pg_temp.`).
 */
interface LexedStatement {
  readonly words: readonly string[];
  readonly callsStateFunction: boolean;
  readonly namesTempSchema: boolean;
}

function savepointOf(words: readonly string[]): SavepointCommand | undefined {
  const [first, second, third, fourth] = words;
  const name = (word: string | undefined) => (word === undefined ? undefined : word.startsWith('"') ? word.slice(1) : word);
  let command: { op: SavepointCommand['op']; name: string | undefined } | undefined;
  if (first === 'savepoint') command = { op: 'open', name: name(second) };
  else if (first === 'release') command = { op: 'release', name: name(second === 'savepoint' ? third : second) };
  else if (first === 'rollback' && second === 'to') command = { op: 'rollback-to', name: name(third === 'savepoint' ? fourth : third) };
  return command?.name === undefined ? undefined : { op: command.op, name: command.name };
}

function effectOf({ words, callsStateFunction, namesTempSchema }: LexedStatement): StatementEffect {
  const [first, second, third] = words;
  if (first === 'rollback') return second === 'to' ? 'plain' : 'ends-transaction';
  if (first === 'prepare') return second === 'transaction' ? 'ends-transaction' : 'leaves-state';
  if (first === 'commit' && second === 'prepared') return 'ends-transaction';
  if (first !== undefined && ENDS_TRANSACTION.has(first)) return 'ends-transaction';
  if (first !== undefined && LEAVES_STATE.has(first)) return 'leaves-state';
  if (first === 'create' && (isTemp(second) || ((second === 'global' || second === 'local') && isTemp(third)) || namesTempSchema)) return 'leaves-state';
  return callsStateFunction ? 'leaves-state' : 'plain';
}

function isTemp(word: string | undefined): boolean {
  return word === 'temp' || word === 'temporary';
}

/** The statements of `text`, split at `;` outside strings, identifiers, dollar quotes and comments. */
function* lexStatements(text: string): Generator<LexedStatement> {
  let words: string[] = [];
  let callsStateFunction = false;
  let namesTempSchema = false;
  let lastWord = '';
  let sawCode = false;
  const end = (): LexedStatement | undefined => {
    const statement = sawCode ? { words, callsStateFunction, namesTempSchema } : undefined;
    words = [];
    callsStateFunction = false;
    namesTempSchema = false;
    lastWord = '';
    sawCode = false;
    return statement;
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i]!;
    if (c === "'") {
      sawCode = true;
      lastWord = '';
      i = endOfQuoted(text, i, "'", isEscapeStringStart(text, i));
    } else if (c === '"') {
      sawCode = true;
      lastWord = '';
      const start = i;
      i = endOfQuoted(text, i, '"', false);
      if (words.length < 4) words.push(`"${text.slice(start + 1, i - 1).replace(/""/g, '"')}`);
    } else if (c === '-' && text[i + 1] === '-') {
      const newline = text.indexOf('\n', i);
      i = newline < 0 ? text.length : newline + 1;
    } else if (c === '/' && text[i + 1] === '*') {
      i = endOfBlockComment(text, i);
    } else if (c === '$' && !isIdentifierChar(text[i - 1])) {
      sawCode = true;
      lastWord = '';
      const tag = /^\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/.exec(text.slice(i, i + 64));
      if (tag) {
        const close = text.indexOf(tag[0], i + tag[0].length);
        i = close < 0 ? text.length : close + tag[0].length;
      } else {
        i++;
      }
    } else if (isIdentifierChar(c)) {
      sawCode = true;
      const start = i;
      while (i < text.length && (isIdentifierChar(text[i]) || text[i] === '$')) i++;
      const word = text.slice(start, i).toLowerCase();
      if (words.length < 4) words.push(word);
      if (word === 'pg_temp' && text[i] === '.') namesTempSchema = true;
      lastWord = word;
    } else if (c === ';') {
      const statement = end();
      if (statement) yield statement;
      i++;
    } else if (c === '(') {
      sawCode = true;
      if (LEAVES_STATE_CALLS.has(lastWord)) callsStateFunction = true;
      lastWord = '';
      i++;
    } else {
      if (!/\s/.test(c)) {
        sawCode = true;
        // `pg_catalog.set_config (`: the qualifier's dot keeps the name as the last word.
        if (c !== '.') lastWord = '';
      }
      i++;
    }
  }
  const last = end();
  if (last) yield last;
}

function isIdentifierChar(c: string | undefined): boolean {
  return c !== undefined && /[A-Za-z0-9_\u0080-\uffff]/.test(c);
}

/** `E'…'` (or `e'…'`) where the E starts a token: backslashes escape inside it. */
function isEscapeStringStart(text: string, quote: number): boolean {
  const before = text[quote - 1];
  return (before === 'E' || before === 'e') && !isIdentifierChar(text[quote - 2]);
}

/** Index just past the quoted string or identifier that starts at `start`. */
function endOfQuoted(text: string, start: number, quote: string, backslashEscapes: boolean): number {
  let i = start + 1;
  while (i < text.length) {
    const c = text[i]!;
    if (backslashEscapes && c === '\\') {
      i += 2;
    } else if (c === quote) {
      if (text[i + 1] === quote) i += 2; // doubled quote: part of the string
      else return i + 1;
    } else {
      i++;
    }
  }
  return text.length;
}

/** Index just past the block comment that starts at `start` (Postgres block comments nest). */
function endOfBlockComment(text: string, start: number): number {
  let depth = 0;
  let i = start;
  while (i < text.length) {
    if (text[i] === '/' && text[i + 1] === '*') {
      depth++;
      i += 2;
    } else if (text[i] === '*' && text[i + 1] === '/') {
      depth--;
      i += 2;
      if (depth === 0) return i;
    } else {
      i++;
    }
  }
  return text.length;
}
