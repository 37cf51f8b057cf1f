import { ResultNotStorableError, ValidationError } from '../errors.js';

/** Longest key or scope, in characters. */
export const MAX_KEY_LENGTH = 255;

/** The scope used when none is given. */
export const DEFAULT_SCOPE = 'default';

/**
 * Checks an idempotency key or scope: a non-empty string of at most 255 characters with no NUL
 * (Postgres text cannot hold one) and no lone UTF-16 surrogate (UTF-8 cannot: node-postgres
 * would send each as U+FFFD, so `k\ud800` and `k\ud801` would share one key row, and the second
 * job would be taken for a duplicate of the first). Throws a {@link ValidationError} naming the
 * field.
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
  if (LONE_SURROGATE_TEST.test(value)) {
    throw new ValidationError(code, field, `${what} must not contain a lone UTF-16 surrogate (\\ud800–\\udfff outside a pair): UTF-8 cannot represent it.`);
  }
}

/**
 * Checks a step name (`ctx.step`): a non-empty string of at most 255 characters with no NUL.
 * Throws a {@link ValidationError} (`INVALID_STEP`) naming the key and scope.
 */
export function assertValidStepName(scope: string, key: string, name: unknown): asserts name is string {
  const refuse = (what: string) =>
    new ValidationError('INVALID_STEP', 'step', `Step name for idempotency key "${key}" in scope "${scope}" ${what}. Name each step with a short, fixed string.`);
  if (typeof name !== 'string') throw refuse(`must be a string, got ${name === null ? 'null' : typeof name}`);
  if (name.length === 0) throw refuse('must not be empty');
  if ([...name].length > MAX_KEY_LENGTH) throw refuse(`is longer than ${MAX_KEY_LENGTH} characters`);
  if (name.includes('\u0000')) throw refuse('must not contain NUL characters');
  if (LONE_SURROGATE_TEST.test(name)) throw refuse('must not contain a lone UTF-16 surrogate');
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
  if (jsonbRefuses(json)) {
    throw new ResultNotStorableError(scope, key, 'it contains a NUL character (\\u0000) or a lone UTF-16 surrogate, which Postgres jsonb cannot store');
  }
  const bytes = Buffer.byteLength(json, 'utf8');
  if (bytes > maxBytes) {
    throw new ResultNotStorableError(scope, key, `it is ${bytes} bytes as JSON; the limit is ${maxBytes} (maxResultBytes)`);
  }
  return json;
}

/**
 * True when Postgres `jsonb` would refuse this `JSON.stringify` output: it holds a NUL (`\u0000`)
 * or a lone UTF-16 surrogate.
 */
export function jsonbRefuses(json: string): boolean {
  return json.includes('\\u') && JSONB_REFUSED_ESCAPE.test(json);
}

/**
 * Checks the payload a claim keeps with its key (`storePayload`): it must be JSON that `jsonb`
 * can store. Returns the JSON; throws a {@link ValidationError} (`INVALID_JOB_DATA`) naming the
 * scope, the key and what is wrong, before any statement is sent (Postgres would refuse it
 * with an error naming neither, on every attempt).
 */
export function serializePayload(scope: string, key: string, payload: unknown): string {
  const refuse = (what: string) =>
    new ValidationError(
      'INVALID_JOB_DATA',
      'payload',
      `Payload of idempotency key "${key}" in scope "${scope}" cannot be stored with the key (storePayload is on): ${what}. ` +
        'Nothing was claimed or run. Send a JSON payload without them, or turn storePayload off.',
    );
  let json: string | undefined;
  try {
    json = JSON.stringify(payload);
  } catch (error) {
    throw refuse(`it is not JSON-serialisable (${describeThrown(error)})`);
  }
  if (json === undefined) throw refuse(`a ${typeof payload} is not JSON-serialisable`);
  if (jsonbRefuses(json)) throw refuse('it contains a NUL character (\\u0000) or a lone UTF-16 surrogate, which Postgres jsonb cannot store');
  return json;
}

/** A plain JSON description of an error, for the `error` column and for replays. */
export interface StoredError {
  /** The error's `name` (`'Error'` for a thrown non-error). */
  readonly name: string;
  /** The error's message (at most 8192 characters), or a description of the thrown value. */
  readonly message: string;
  /** The error's own string `code`, when it has one (an {@link IdempotencyError}'s, a driver's). @defaultValue absent */
  readonly code?: string;
  /** The step (`ctx.step`) that threw it, when one did. */
  readonly step?: string;
}

/** Which step of a multi-step job an error came from. */
export interface FailedStep {
  /** The step's name. */
  readonly name: string;
  /** 1-based position in the key's step sequence. */
  readonly position: number;
}

/**
 * Longest stored error message, in UTF-16 code units; a longer one is cut there and says so.
 * 8 KiB of text keeps a stack of nested causes or a quoted input readable, while a handler that
 * throws a megabyte of text cannot bloat every replay and the key's row.
 */
export const MAX_STORED_ERROR_MESSAGE_LENGTH = 8192;

/** Longest stored error name or code: they are identifiers, not prose. */
const MAX_STORED_ERROR_NAME_LENGTH = 256;

/**
 * Turns anything thrown into a {@link StoredError} that Postgres `jsonb` can always store: NUL
 * characters and lone surrogates become U+FFFD (`JSON.parse` of binary data, for one, quotes
 * a raw NUL in its message), the message is cut at 8192 characters, and
 * it never throws, whatever was thrown (a getter that throws, a Proxy, a Symbol, an object
 * whose `toString` throws): a failure must always be recorded, or its key stays `processing`.
 */
export function toStoredError(error: unknown, step?: FailedStep): StoredError {
  let name = 'Error';
  let message: string;
  let code: string | undefined;
  try {
    if (error instanceof Error) {
      name = describe(() => error.name) || 'Error';
      message = describe(() => error.message);
      const ownCode = attempt(() => (error as { code?: unknown }).code);
      if (typeof ownCode === 'string') code = ownCode;
    } else {
      message = describeThrown(error);
    }
  } catch {
    message = 'an unreadable value was thrown';
  }
  if (step) message = `Step "${step.name}" (position ${step.position}) failed: ${message}`;
  const stored: StoredError = { name: storableText(name, MAX_STORED_ERROR_NAME_LENGTH), message: storableText(message, MAX_STORED_ERROR_MESSAGE_LENGTH) };
  const coded = code === undefined ? stored : { ...stored, code: storableText(code, MAX_STORED_ERROR_NAME_LENGTH) };
  return step ? { ...coded, step: storableText(step.name, MAX_STORED_ERROR_MESSAGE_LENGTH) } : coded;
}

/** A lone surrogate: a high one not followed by a low one, or a low one not preceded by a high one. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
const LONE_SURROGATE_TEST = new RegExp(LONE_SURROGATE.source);

/** `text` with NUL and lone surrogates replaced by U+FFFD, cut to `maxLength` code units (never inside a pair). */
function storableText(text: string, maxLength: number): string {
  let clean = text.replaceAll('\u0000', '\ufffd').replace(LONE_SURROGATE, '\ufffd');
  if (clean.length > maxLength) {
    const note = ` … [cut: ${clean.length} characters in all]`;
    let end = maxLength - note.length;
    if (/[\ud800-\udbff]/.test(clean.charAt(end - 1))) end--;
    clean = clean.slice(0, end) + note;
  }
  return clean;
}

/** What a thrown non-Error value looks like as text: its JSON, else `String()` of it. */
function describeThrown(value: unknown): string {
  if (typeof value === 'string') return value;
  const json = attempt(() => JSON.stringify(value));
  if (typeof json === 'string') return json;
  return describe(() => value);
}

/** `String(read())`, or a placeholder when reading or converting it throws. */
function describe(read: () => unknown): string {
  try {
    return String(read());
  } catch {
    return '(unreadable)';
  }
}

function attempt<T>(read: () => T): T | undefined {
  try {
    return read();
  } catch {
    return undefined;
  }
}
