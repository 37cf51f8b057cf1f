import { createRequire } from 'node:module';
import pg from 'pg';

// node-postgres's own conversion of a JavaScript value to the text it sends for a parameter.
const { prepareValue } = createRequire(import.meta.url)('pg/lib/utils.js') as { prepareValue: (value: unknown) => unknown };

/**
 * Writes a parameterized statement (`$1`, `$2`, … placeholders) as literal SQL, so that it can
 * share a simple-protocol string, and so a round trip, with other statements (group commit
 * sends a job's SAVEPOINT with the job's first statement).
 *
 * Each value becomes exactly the text node-postgres would have sent for it as a parameter
 * (`prepareValue`: dates, arrays, JSON objects, `toPostgres`), escaped as a string literal by
 * node-postgres's `escapeLiteral`. Both a text parameter and a quoted literal have type
 * `unknown` until Postgres infers it from the context, so the statement means the same.
 * `null` and `undefined` become NULL.
 *
 * Placeholders are found by a small lexer that skips what is not code: quoted strings (with
 * `''` and, in `E'…'`, backslash escapes), quoted identifiers, dollar-quoted strings and
 * comments; a `$` inside an identifier (`a$1`) is not a placeholder.
 *
 * Returns undefined when the statement cannot be written this way: binary values (Buffer,
 * typed arrays: node-postgres sends them in binary format), or a placeholder without a value.
 */
export function inlineParameters(text: string, parameters: readonly unknown[]): string | undefined {
  if (parameters.length === 0) return text;
  const literals: string[] = [];
  for (const parameter of parameters) {
    const prepared = prepareValue(parameter);
    if (prepared === null || prepared === undefined) literals.push('NULL');
    else if (typeof prepared === 'string') literals.push(pg.escapeLiteral(prepared));
    else return undefined;
  }
  let out = '';
  let copiedUpTo = 0;
  let i = 0;
  while (i < text.length) {
    const c = text[i]!;
    if (c === "'") {
      i = endOfQuoted(text, i, "'", isEscapeStringStart(text, i));
    } else if (c === '"') {
      i = endOfQuoted(text, i, '"', false);
    } else if (c === '-' && text[i + 1] === '-') {
      const newline = text.indexOf('\n', i);
      i = newline < 0 ? text.length : newline + 1;
    } else if (c === '/' && text[i + 1] === '*') {
      i = endOfBlockComment(text, i);
    } else if (c === '$' && !isIdentifierChar(text[i - 1])) {
      const placeholder = /^\$(\d+)/.exec(text.slice(i, i + 12));
      if (placeholder) {
        const literal = literals[Number(placeholder[1]) - 1];
        if (literal === undefined) return undefined;
        out += text.slice(copiedUpTo, i) + literal;
        i += placeholder[0].length;
        copiedUpTo = i;
        continue;
      }
      const tag = /^\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/.exec(text.slice(i));
      if (tag) {
        const close = text.indexOf(tag[0], i + tag[0].length);
        i = close < 0 ? text.length : close + tag[0].length;
      } else {
        i++;
      }
    } else if (isIdentifierChar(c)) {
      // Skip the whole word, so that a `$` inside it (a$1) is not taken for a placeholder.
      while (i < text.length && (isIdentifierChar(text[i]) || text[i] === '$')) i++;
    } else {
      i++;
    }
  }
  return out + text.slice(copiedUpTo);
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
