/**
 * What a JSON value must be for this system to store it, fingerprint it and hand it on: the
 * one check every boundary (HTTP bodies, job data read from BullMQ, the fingerprint) applies
 * before anything recursive or anything Postgres sees the value.
 *
 * The walk is iterative (an explicit stack), so a value nested a million deep is refused in
 * linear time instead of overflowing the stack the way a recursive serialiser would.
 */

/** Deepest nesting of arrays and objects accepted in a job payload. */
export const MAX_PAYLOAD_DEPTH = 64;

/**
 * Deepest nesting the fingerprint accepts: a payload at {@link MAX_PAYLOAD_DEPTH} plus the
 * few levels the callers wrap around it (`{ name, payload }`, `{ queue, name, payload }`),
 * and still far below what the recursive RFC 8785 canonicaliser can descend without
 * overflowing the stack.
 */
export const MAX_FINGERPRINT_DEPTH = 128;

/** What a value is checked against. */
export interface JsonLimits {
  /** Deepest nesting of arrays and objects. */
  readonly maxDepth: number;
  /**
   * Whether strings (and object keys) may contain NUL (`\u0000`). Postgres `jsonb` refuses
   * it, so values that are stored must not; a payload only handed to a handler may.
   */
  readonly allowNul: boolean;
  /**
   * Numbers that were integer literals in the source text but could not be read exactly
   * (beyond ±(2^53 − 1)), from {@link lossyIntegerLiterals}. Empty when there is no text.
   */
  readonly lossyNumbers?: ReadonlySet<number>;
}

/** What is wrong with a value and where. */
export interface JsonProblem {
  /**
   * RFC 6901 JSON Pointer to the offending value (`""` is the value itself), each segment
   * made {@link printable}.
   */
  readonly pointer: string;
  /** What is wrong, as a phrase: "is nested deeper than 64 levels". */
  readonly problem: string;
}

interface Visit {
  readonly value: unknown;
  readonly depth: number;
  readonly key: string | undefined;
  readonly parent: Visit | undefined;
}

/**
 * The first reason `value` cannot be stored or fingerprinted, or undefined when it can:
 * nesting deeper than `maxDepth` (cycles included), a non-finite number (`1e400` parses as
 * Infinity), an integer that lost precision when parsed, a BigInt, a string or object key
 * holding a lone UTF-16 surrogate (neither UTF-8 nor RFC 8785 can represent one), or a NUL
 * when `allowNul` is false. `undefined`, functions and symbols are left alone: JSON
 * serialisation drops them the same way everywhere.
 */
export function findJsonProblem(value: unknown, limits: JsonLimits): JsonProblem | undefined {
  const stack: Visit[] = [{ value, depth: 0, key: undefined, parent: undefined }];
  while (stack.length > 0) {
    const visit = stack.pop()!;
    let current = visit.value;
    if (current !== null && typeof current === 'object' && typeof (current as { toJSON?: unknown }).toJSON === 'function') {
      // Serialisers call toJSON (a Date becomes a string): check what they will see.
      current = (current as { toJSON: () => unknown }).toJSON();
    }
    const problem = problemOfScalar(current, limits);
    if (problem) return { pointer: pointerOf(visit), problem };
    if (current === null || typeof current !== 'object') continue;
    if (visit.depth + 1 > limits.maxDepth) {
      return { pointer: pointerOf(visit), problem: `is nested deeper than ${limits.maxDepth} levels of arrays and objects` };
    }
    const depth = visit.depth + 1;
    if (Array.isArray(current)) {
      for (let index = current.length - 1; index >= 0; index--) {
        stack.push({ value: current[index], depth, key: String(index), parent: visit });
      }
      continue;
    }
    const keys = Object.keys(current);
    for (let index = keys.length - 1; index >= 0; index--) {
      const key = keys[index]!;
      const keyProblem = problemOfString(key, limits);
      if (keyProblem) return { pointer: pointerOf({ value: key, depth, key, parent: visit }), problem: `has a key that ${keyProblem}` };
      stack.push({ value: (current as Record<string, unknown>)[key], depth, key, parent: visit });
    }
  }
  return undefined;
}

/** "is nested deeper than 64 levels of arrays and objects at /a/0" — for messages. */
export function describeJsonProblem(found: JsonProblem): string {
  return `${found.problem} at ${found.pointer === '' ? 'the top level' : found.pointer}`;
}

/**
 * The integers written in JSON `text` that `JSON.parse` cannot read exactly: integer
 * literals (no fraction, no exponent) beyond ±(2^53 − 1), as the numbers they were rounded
 * to. `12345678901234567890` parses as 12345678901234567000 without complaint, so a client's
 * id or amount would silently change; a number written as a float (`1e20`, `6.02e23`) was
 * meant to be approximate and is not listed. Strings are skipped, so digits inside them do
 * not count.
 */
export function lossyIntegerLiterals(text: string): ReadonlySet<number> {
  const lossy = new Set<number>();
  // Fewer than 16 digits in a row: every integer literal is exact.
  if (!/\d{16}/.test(text)) return lossy;
  const number = /-?\d+(\.\d+)?([eE][+-]?\d+)?/y;
  for (let at = 0; at < text.length; ) {
    const char = text.charCodeAt(at);
    if (char === 0x22 /* " */) {
      at = endOfString(text, at);
      continue;
    }
    if (char === 0x2d /* - */ || (char >= 0x30 && char <= 0x39)) {
      number.lastIndex = at;
      const match = number.exec(text);
      if (!match) {
        at++;
        continue;
      }
      const literal = match[0];
      const digits = literal.startsWith('-') ? literal.length - 1 : literal.length;
      // 2^53 has 16 digits: shorter integers are always exact.
      if (match[1] === undefined && match[2] === undefined && digits >= 16) {
        const parsed = Number(literal);
        if (!Number.isSafeInteger(parsed)) lossy.add(parsed);
      }
      at += literal.length;
      continue;
    }
    at++;
  }
  return lossy;
}

function problemOfScalar(value: unknown, limits: JsonLimits): string | undefined {
  switch (typeof value) {
    case 'number':
      if (!Number.isFinite(value)) return `is a number JSON cannot hold (${value}; numbers beyond ±1.8e308 overflow)`;
      if (limits.lossyNumbers?.has(value)) {
        return 'is an integer beyond ±(2^53 − 1), which cannot be read exactly (it would be rounded); send it as a string';
      }
      return undefined;
    case 'string':
      return problemOfString(value, limits);
    case 'bigint':
      return 'is a BigInt, which JSON cannot hold; send it as a string';
    default:
      return undefined;
  }
}

/** A UTF-16 surrogate not in a high-low pair (matched on code units: no `u` flag). */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
/** What {@link printable} escapes: control characters and lone surrogates. */
// eslint-disable-next-line no-control-regex -- control characters are what it finds
const UNPRINTABLE = /[\u0000-\u001f\u007f]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
/** Longest piece of client text quoted in a message. */
const MAX_QUOTED_LENGTH = 100;

/**
 * `text` made safe to quote in an error message: control characters and lone surrogates
 * written as `\uXXXX` escapes (a message is logged, stored in jsonb, sent as JSON; none of
 * those takes a lone surrogate or a NUL), and cut to 100 characters.
 */
export function printable(text: string): string {
  const cut = text.length > MAX_QUOTED_LENGTH ? `${text.slice(0, MAX_QUOTED_LENGTH)}…` : text;
  return cut.replace(UNPRINTABLE, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

function problemOfString(value: string, limits: JsonLimits): string | undefined {
  if (LONE_SURROGATE.test(value)) return 'holds a lone UTF-16 surrogate (\\ud800–\\udfff outside a pair), which UTF-8 cannot represent';
  if (!limits.allowNul && value.includes('\u0000')) return 'holds a NUL character (\\u0000), which Postgres cannot store';
  return undefined;
}

/** Index just past the string literal that starts at `start` (its opening quote). */
function endOfString(text: string, start: number): number {
  for (let at = start + 1; at < text.length; at++) {
    const char = text.charCodeAt(at);
    if (char === 0x5c /* \ */) at++;
    else if (char === 0x22) return at + 1;
  }
  return text.length;
}

function pointerOf(visit: Visit): string {
  const parts: string[] = [];
  for (let at: Visit | undefined = visit; at?.key !== undefined; at = at.parent) {
    parts.push(printable(at.key.replace(/~/g, '~0').replace(/\//g, '~1')));
  }
  return parts.length === 0 ? '' : `/${parts.reverse().join('/')}`;
}
