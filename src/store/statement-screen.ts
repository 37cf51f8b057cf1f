/**
 * What a statement of a job's own (not the store's) does to the transaction it runs in, read from
 * its text. The store runs a job's effect on a transaction whose BEGIN and COMMIT are its own,
 * and group commit runs several jobs' effects on one transaction; both need to know a statement
 * that would end that transaction, or leave state behind for the statements after it.
 *
 * The text is read by a small lexer that skips what is not code: quoted strings (with `''` and,
 * in `E'…'`, backslash escapes; read also as `standard_conforming_strings = off` reads them,
 * with backslash escapes in every string, see `readText`), quoted identifiers, dollar-quoted
 * strings and comments (block comments nest). It looks at each statement's first words, at calls of `set_config`, of the
 * session-level advisory lock functions and of the built-ins that run a query given as text, at
 * the names `pg_temp` and `pg_settings`, and at savepoint commands; what a function does inside
 * is out of its sight (group commit compares the transaction's state after each job, see
 * `sql/group-settings.ts`).
 */

/**
 * - `'ends-transaction'`: BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK (but not ROLLBACK TO
 *   a savepoint), ABORT, PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED: would end (or try to
 *   begin) the transaction that must commit the effect with its key. Never allowed.
 * - `'leaves-state'`: SET and RESET of any kind (`SET LOCAL`, `SET ROLE`, `SET CONSTRAINTS`,
 *   `SET TRANSACTION`, …), `set_config(…)` (quoted too), an update of `pg_settings`, CREATE [OR
 *   REPLACE] [GLOBAL | LOCAL] TEMP …, anything made in `pg_temp` (quoted, or with spaces before
 *   the dot), `SELECT … INTO TEMP` (or LOCAL, GLOBAL, `pg_temp.`), DECLARE (a cursor), DO (an
 *   anonymous block), CREATE [OR REPLACE] FUNCTION or PROCEDURE (code the job may then call),
 *   EXPLAIN ANALYZE (it runs its statement), DISCARD, LISTEN, UNLISTEN, LOAD, PREPARE,
 *   DEALLOCATE, a call of a session-level advisory lock function (`pg_advisory_lock`,
 *   `pg_try_advisory_lock`, their `_shared` forms, `pg_advisory_unlock…`) or of a built-in that
 *   runs a query given as text (`query_to_xml` and its variants, `ts_stat`, `ts_rewrite`):
 *   changes what later statements of the same transaction or session see, or may. Allowed in a
 *   job's own transaction; a job that sends one runs alone, never in a group.
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
/** A statement's first words kept (`CREATE OR REPLACE GLOBAL TEMP VIEW` needs six). */
const WORDS_KEPT = 6;
// `do`: an anonymous block, code no catalog keeps, which may do any of these.
const LEAVES_STATE = new Set(['set', 'reset', 'discard', 'listen', 'unlisten', 'load', 'deallocate', 'declare', 'do']);
/**
 * Functions whose call changes the session for the statements after it, or runs a query given
 * as text (`query_to_xml`, `ts_stat`, `ts_rewrite`: the text could change it).
 */
const LEAVES_STATE_CALLS = new Set([
  'set_config',
  'query_to_xml',
  'query_to_xmlschema',
  'query_to_xml_and_xmlschema',
  'ts_stat',
  'ts_rewrite',
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

/**
 * Reads `text` as Postgres reads it under either value of `standard_conforming_strings`, a
 * setting a role, a database or a connection may turn off, which the text does not say: off, a
 * backslash escapes in every quoted string, not only in `E'…'`, so `'\''` is one string where
 * on it is a string and the start of another. Where the two readings differ (only a text with a
 * backslash in a plain string can), the answer holds for both: the stronger effect, at least
 * `'leaves-state'` (the job runs alone, outside any group, where its savepoints need no keeping
 * apart), and the larger count. So text that ends the transaction under one reading is refused
 * under both; the cost is a rare legitimate text refused (a string ending in a backslash and a
 * later string holding `; commit`), never a COMMIT that slips through.
 */
function readText(text: string): ScreenedText {
  const standard = readTextAs(text, false);
  if (!text.includes('\\')) return standard;
  const escaping = readTextAs(text, true);
  if (sameReading(standard, escaping)) return standard;
  return {
    effect: strongest(strongest(standard.effect, escaping.effect), 'leaves-state'),
    statements: Math.max(standard.statements, escaping.statements),
    savepoints: standard.savepoints,
  };
}

function sameReading(a: ScreenedText, b: ScreenedText): boolean {
  return (
    a.effect === b.effect &&
    a.statements === b.statements &&
    a.savepoints.length === b.savepoints.length &&
    a.savepoints.every((command, i) => command.op === b.savepoints[i]!.op && command.name === b.savepoints[i]!.name)
  );
}

const STRENGTH: Record<StatementEffect, number> = { plain: 0, 'leaves-state': 1, 'ends-transaction': 2 };

function strongest(a: StatementEffect, b: StatementEffect): StatementEffect {
  return STRENGTH[a] >= STRENGTH[b] ? a : b;
}

/** `text` read with backslash escapes in `E'…'` strings only (`standard_conforming_strings` on), or in every quoted string (off). */
function readTextAs(text: string, backslashEscapesEverywhere: boolean): ScreenedText {
  let effect: StatementEffect = 'plain';
  let statements = 0;
  const savepoints: SavepointCommand[] = [];
  for (const statement of lexStatements(text, backslashEscapesEverywhere)) {
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
  /** It has `INTO TEMP`, `INTO TEMPORARY`, `INTO LOCAL`/`GLOBAL` (TEMP) or `INTO pg_temp.` (a `SELECT … INTO` that makes a temporary table). */
  readonly intoTemp: boolean;
  /** It names `pg_settings` (whose update rule calls `set_config`). */
  readonly namesSettings: boolean;
  /** It has the word ANALYZE (or ANALYSE) anywhere. */
  readonly saysAnalyze: boolean;
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

function effectOf({ words, callsStateFunction, namesTempSchema, intoTemp, namesSettings, saysAnalyze }: LexedStatement): StatementEffect {
  const [first, second, third, fourth] = words;
  if (first === 'rollback') return second === 'to' ? 'plain' : 'ends-transaction';
  if (first === 'prepare') return second === 'transaction' ? 'ends-transaction' : 'leaves-state';
  if (first === 'commit' && second === 'prepared') return 'ends-transaction';
  if (first !== undefined && ENDS_TRANSACTION.has(first)) return 'ends-transaction';
  if (first !== undefined && LEAVES_STATE.has(first)) return 'leaves-state';
  if (first === 'create') {
    // CREATE [OR REPLACE] [GLOBAL | LOCAL] TEMP …, or anything made in pg_temp.
    const [kind, next] = second === 'or' && third === 'replace' ? [fourth, words[4]] : [second, third];
    if (isTemp(kind) || ((kind === 'global' || kind === 'local') && isTemp(next)) || namesTempSchema) return 'leaves-state';
    // Code made by a job and called after it is code no read of the catalogs has seen.
    if (kind === 'function' || kind === 'procedure') return 'leaves-state';
  }
  // `INSERT INTO temp …` names a table called temp; only a query's INTO makes one.
  if ((first === 'select' || first === 'with') && intoTemp) return 'leaves-state';
  // An update of pg_settings sets what it names (its rule calls set_config); reading it is plain.
  if (namesSettings && (first === 'update' || first === 'with' || first === 'insert' || first === 'merge')) return 'leaves-state';
  // EXPLAIN ANALYZE runs its statement, whose words this reading does not follow past the options.
  if (first === 'explain' && saysAnalyze) return 'leaves-state';
  return callsStateFunction ? 'leaves-state' : 'plain';
}

function isTemp(word: string | undefined): boolean {
  return word === 'temp' || word === 'temporary';
}

/**
 * The statements of `text`, split at `;` outside strings, identifiers, dollar quotes and
 * comments; `backslashEscapesEverywhere`: a backslash escapes in every quoted string (as under
 * `standard_conforming_strings = off`), not only in `E'…'`.
 */
function* lexStatements(text: string, backslashEscapesEverywhere: boolean): Generator<LexedStatement> {
  let words: string[] = [];
  let callsStateFunction = false;
  let namesTempSchema = false;
  let intoTemp = false;
  let namesSettings = false;
  let saysAnalyze = false;
  let lastWord = '';
  let sawCode = false;
  const end = (): LexedStatement | undefined => {
    const statement = sawCode ? { words, callsStateFunction, namesTempSchema, intoTemp, namesSettings, saysAnalyze } : undefined;
    words = [];
    callsStateFunction = false;
    namesTempSchema = false;
    intoTemp = false;
    namesSettings = false;
    saysAnalyze = false;
    lastWord = '';
    sawCode = false;
    return statement;
  };
  let i = 0;
  // A name just read (unquoted: lower case), at `i` just past it.
  const noteName = (name: string) => {
    if (name === 'pg_temp' && text.slice(i).trimStart().startsWith('.')) {
      namesTempSchema = true;
      if (lastWord === 'into') intoTemp = true;
    }
    if (name === 'pg_settings') namesSettings = true;
    lastWord = name;
  };
  while (i < text.length) {
    const c = text[i]!;
    if (c === "'") {
      sawCode = true;
      lastWord = '';
      i = endOfQuoted(text, i, "'", backslashEscapesEverywhere || isEscapeStringStart(text, i));
    } else if (c === '"') {
      sawCode = true;
      const start = i;
      i = endOfQuoted(text, i, '"', false);
      const name = text.slice(start + 1, i - 1).replace(/""/g, '"');
      if (words.length < WORDS_KEPT) words.push(`"${name}`);
      // A quoted name is the name itself: `"set_config"(…)` calls set_config, `"pg_temp".t` is temporary.
      noteName(name);
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
      if (words.length < WORDS_KEPT) words.push(word);
      if (lastWord === 'into' && (isTemp(word) || word === 'local' || word === 'global')) intoTemp = true;
      if (word === 'analyze' || word === 'analyse') saysAnalyze = true;
      noteName(word);
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
