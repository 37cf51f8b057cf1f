import { ResultNotStorableError, ValidationError } from '../errors.js';

/** Longest key or scope, in characters. */
export const MAX_KEY_LENGTH = 255;

/** The scope used when none is given. */
export const DEFAULT_SCOPE = 'default';

/**
 * Checks an idempotency key or scope: a non-empty string of at most 255 characters with no NUL
 * (Postgres text cannot hold one). Throws a {@link ValidationError} naming the field.
 */
export function assertValidKeyPart(field: 'key' | 'scope', value: unknown): asserts value is string {
  const code = field === 'key' ? 'INVALID_KEY' : 'INVALID_SCOPE';
  const what = field === 'key' ? 'Idempotency key' : 'Idempotency scope';
  if (typeof value !== 'string') {
    throw new ValidationError(code, field, `${what} must be a string, got ${value === null ? 'null' : typeof value}.`);
  }
  if (value.length === 0) throw new ValidationError(code, field, `${what} must not be empty.`);
  const length = [...value].length;
  if (length > MAX_KEY_LENGTH) {
    throw new ValidationError(
      code,
      field,
      `${what} is ${length} characters long; at most ${MAX_KEY_LENGTH} are allowed. Hash long identifiers into a key.`,
    );
  }
  if (value.includes('\u0000')) throw new ValidationError(code, field, `${what} must not contain NUL characters.`);
}

/**
 * An escape in `JSON.stringify` output that Postgres `jsonb` refuses: `\u0000` (NUL) or a lone
 * UTF-16 surrogate (`\ud800`-`\udfff`; paired surrogates are written as the character
 * itself). Preceded by an even number of backslashes, so an escaped backslash followed by the
 * letters `u0000` does not count.
 */
const JSONB_REFUSED_ESCAPE = /(?<!\\)(?:\\\\)*\\u(?:0000|d[89a-f][0-9a-f]{2})/i;

/**
 * Serialises an effect's result for storage. `undefined` is stored as JSON null. Throws
 * {@link ResultNotStorableError} when it is not JSON (BigInt, cycles, functions), holds text
 * `jsonb` cannot store (NUL, lone surrogates: refused here rather than by Postgres, whose error
 * would arrive in the middle of a transaction, in group commit after the next job's statement),
 * or is too large.
 */
export function serializeResult(scope: string, key: string, result: unknown, maxBytes: number): string {
  let json: string | undefined;
  try {
    json = result === undefined ? 'null' : JSON.stringify(result);
  } catch (error) {
    throw new ResultNotStorableError(scope, key, `it is not JSON-serialisable (${(error as Error).message})`, {
      cause: error,
    });
  }
  if (json === undefined) {
    throw new ResultNotStorableError(scope, key, `a ${typeof result} is not JSON-serialisable`);
  }
  if (json.includes('\\u') && JSONB_REFUSED_ESCAPE.test(json)) {
    throw new ResultNotStorableError(scope, key, 'it contains a NUL character (\\u0000) or a lone UTF-16 surrogate, which Postgres jsonb cannot store');
  }
  const bytes = Buffer.byteLength(json, 'utf8');
  if (bytes > maxBytes) {
    throw new ResultNotStorableError(scope, key, `it is ${bytes} bytes as JSON; the limit is ${maxBytes} (maxResultBytes)`);
  }
  return json;
}

/** A plain JSON description of an error, for the `error` column and for replays. */
export interface StoredError {
  readonly name: string;
  readonly message: string;
  readonly code?: string;
}

/** Turns anything thrown into a {@link StoredError}. */
export function toStoredError(error: unknown): StoredError {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return typeof code === 'string'
      ? { name: error.name, message: error.message, code }
      : { name: error.name, message: error.message };
  }
  return { name: 'Error', message: typeof error === 'string' ? error : safeJson(error) };
}

function safeJson(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
