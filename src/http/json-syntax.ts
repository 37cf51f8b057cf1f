/**
 * Where a JSON text stops being JSON: a small recursive-descent scanner (RFC 8259) that
 * returns the offset and a description of the first error, for a 400 that says where. V8's
 * own messages carry a position only for some errors, and their wording changes between Node
 * versions.
 */
export interface JsonSyntaxError {
  /** Offset of the first character that is not JSON (the text's length: it ended too soon). */
  readonly offset: number;
  /** 1-based line and column of {@link offset}. */
  readonly line: number;
  readonly column: number;
  /** What was found there, e.g. `unexpected "}"` or `unexpected end of the body`. */
  readonly found: string;
}

/** Deeper than this, the scanner stops (a body of a million brackets must not overflow the stack). */
const MAX_DEPTH = 512;
const WHITESPACE = new Set([' ', '\t', '\n', '\r']);
const LITERALS = ['true', 'false', 'null'];
const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
// A string: any character but a quote, a backslash or a control character (U+0000–U+001F), or an escape.
// eslint-disable-next-line no-control-regex -- JSON forbids raw control characters in strings: the scanner must refuse them too.
const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;

/** The first syntax error of `text`, or undefined when it is one JSON value. */
export function findJsonSyntaxError(text: string): JsonSyntaxError | undefined {
  let at = 0;
  const fail = (reason?: string): never => {
    throw new Stop(at, reason);
  };
  const skip = () => {
    while (at < text.length && WHITESPACE.has(text[at]!)) at++;
  };
  const expect = (char: string) => {
    skip();
    if (text[at] !== char) fail();
    at++;
  };
  const matchAt = (pattern: RegExp) => {
    pattern.lastIndex = at;
    if (!pattern.test(text)) fail();
    at = pattern.lastIndex;
  };
  const value = (depth: number): void => {
    skip();
    if (depth > MAX_DEPTH) fail(`nesting deeper than ${MAX_DEPTH} levels`);
    const char = text[at];
    if (char === '{' || char === '[') {
      const close = char === '{' ? '}' : ']';
      at++;
      skip();
      if (text[at] === close) {
        at++;
        return;
      }
      for (;;) {
        if (char === '{') {
          skip();
          matchAt(STRING);
          expect(':');
        }
        value(depth + 1);
        skip();
        if (text[at] === ',') {
          at++;
          continue;
        }
        expect(close);
        return;
      }
    }
    if (char === '"') return matchAt(STRING);
    const literal = LITERALS.find((word) => text.startsWith(word, at));
    if (literal) {
      at += literal.length;
      return;
    }
    matchAt(NUMBER);
  };
  try {
    value(0);
    skip();
    if (at < text.length) fail();
    return undefined;
  } catch (error) {
    if (!(error instanceof Stop)) throw error;
    return located(text, error.offset, error.reason);
  }
}

class Stop {
  constructor(
    readonly offset: number,
    readonly reason?: string,
  ) {}
}

function located(text: string, offset: number, reason?: string): JsonSyntaxError {
  const before = text.slice(0, offset);
  const line = before.split('\n').length;
  const column = offset - (before.lastIndexOf('\n') + 1) + 1;
  const found = reason ?? (offset >= text.length ? 'unexpected end of the body' : `unexpected ${JSON.stringify(String.fromCodePoint(text.codePointAt(offset)!))}`);
  return { offset, line, column, found };
}
