import { isUtf8 } from 'node:buffer';

/**
 * What a handler answers: the status, the headers it chooses, and the body. A body is a JSON
 * value (sent as `application/json; charset=utf-8`), a string (`text/plain; charset=utf-8`),
 * bytes (`application/octet-stream`), or absent; a `content-type` header of the handler's own
 * takes the place of these defaults.
 */
export interface IdempotentResponse {
  /** HTTP status, 200–599. Below 500 the response is stored and replayed; 5xx releases the key. */
  readonly status: number;
  /** Response headers the handler chooses: stored and replayed with the response. @defaultValue none */
  readonly headers?: Readonly<Record<string, string | number | readonly string[]>>;
  /** The body: a JSON value, a string, bytes (`Uint8Array`), or undefined for none. @defaultValue none */
  readonly body?: unknown;
}

/** A response ready to send: what every framework adapter writes out. */
export interface RequestAnswer {
  /** HTTP status. */
  readonly status: number;
  /** Headers, lower-case names. */
  readonly headers: Readonly<Record<string, string | readonly string[]>>;
  /** The body's bytes, or undefined for none. */
  readonly body: Buffer | undefined;
}

/**
 * A response as its key stores it (the key's result, `jsonb`): the body as text when it is UTF-8
 * and no longer so than as base64, else base64, so that a body takes at most 4/3 of its size
 * once stored, whatever its bytes (text of control characters would take six times as JSON).
 */
export interface StoredResponse {
  /** HTTP status. */
  readonly status: number;
  /** Header lines, lower-case names, in order. */
  readonly headers: ReadonlyArray<readonly [string, string]>;
  /** The body: UTF-8 text without NUL (`text`), other bytes (`base64`), or null for none. */
  readonly body:
    | {
        /** The body as UTF-8 text (it has no NUL). */
        readonly text: string;
      }
    | {
        /** The body's bytes, base64-encoded (not UTF-8, with NUL, or longer as JSON text than so). */
        readonly base64: string;
      }
    | null;
}

/** A handler's response the library cannot send or store (a bad status, header or body): answered 500, never stored. */
export class UnsendableResponseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UnsendableResponseError';
  }
}

/** Headers that describe one connection or one message, not the response: never stored nor replayed. */
const PER_MESSAGE_HEADERS = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'content-length', 'date', 'idempotent-replayed']);
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Field values may hold visible characters, spaces and tabs, never CR, LF or NUL (RFC 9110 §5.5). */
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

/** Statuses whose responses carry no body (RFC 9110: 204 and 304; 205 must send none). */
const NO_BODY_STATUSES = new Set([204, 205, 304]);

/**
 * How much of a stored response {@link storedResponseBytesBound} leaves to its header lines (as
 * JSON), well above what responses carry (a location, an etag, a content type). A response whose
 * headers take more may not fit its key; it is then refused before its key completes.
 */
export const STORED_HEADERS_ALLOWANCE_BYTES = 8_192;
/** The stored form's JSON besides its header lines and body (a status has three digits): `{"status":200,"headers":[],"body":null}`. */
const ENVELOPE_BYTES = JSON.stringify({ status: 200, headers: [], body: null }).length;
/** What `{"text":""}` and `{"base64":""}` add around a body's characters, in place of `null`. */
const TEXT_WRAPPING_BYTES = '{"text":""}'.length - 'null'.length;
const BASE64_WRAPPING_BYTES = '{"base64":""}'.length - 'null'.length;

/**
 * The most a response whose body has up to `maxBodyBytes` bytes takes once stored, as the JSON
 * its key's result is measured in (`maxResultBytes`), its headers within
 * {@link STORED_HEADERS_ALLOWANCE_BYTES}: its body base64-encoded, the longest form it is stored in.
 */
export function storedResponseBytesBound(maxBodyBytes: number): number {
  return ENVELOPE_BYTES + STORED_HEADERS_ALLOWANCE_BYTES + BASE64_WRAPPING_BYTES + base64Bytes(maxBodyBytes);
}

/** The largest `maxBodyBytes` whose responses fit in `maxStoredBytes` once stored (see {@link storedResponseBytesBound}); 0 when none does. */
export function largestStorableBodyBytes(maxStoredBytes: number): number {
  const base64Room = maxStoredBytes - (ENVELOPE_BYTES + STORED_HEADERS_ALLOWANCE_BYTES + BASE64_WRAPPING_BYTES);
  return Math.max(0, Math.floor(base64Room / 4) * 3);
}

/**
 * Checks and encodes a handler's response for storage and sending. Throws
 * {@link UnsendableResponseError} for a status outside 200–599, a malformed header, a body that
 * is not JSON (a function, a cycle, a BigInt), a body over `maxBodyBytes`, or a response over
 * `maxStoredBytes` once stored (as JSON, as the key's `maxResultBytes` measures it): refused
 * here, inside the handler's transaction and before the key's completion, it commits nothing.
 * A body given with 204, 205 or 304 is dropped.
 */
export function encodeResponse(
  response: IdempotentResponse,
  maxBodyBytes: number,
  maxStoredBytes = Number.POSITIVE_INFINITY,
): { stored: StoredResponse; answer: RequestAnswer } {
  if (response === null || typeof response !== 'object') throw new UnsendableResponseError(`A handler must answer { status, headers?, body? }, got ${response === null ? 'null' : typeof response}.`);
  const { status } = response;
  if (typeof status !== 'number' || !Number.isInteger(status) || status < 200 || status > 599) {
    throw new UnsendableResponseError(`A handler's response status must be a whole number from 200 to 599, got ${String(status)}.`);
  }
  const headers: Array<[string, string]> = [];
  for (const [rawName, rawValue] of Object.entries(response.headers ?? {})) {
    const name = rawName.toLowerCase();
    if (!HEADER_NAME.test(name)) throw new UnsendableResponseError(`Response header name ${JSON.stringify(rawName)} is not a valid field name.`);
    if (PER_MESSAGE_HEADERS.has(name)) continue;
    for (const value of Array.isArray(rawValue) ? rawValue : [rawValue]) {
      const text = typeof value === 'number' ? String(value) : value;
      if (typeof text !== 'string' || !HEADER_VALUE.test(text)) throw new UnsendableResponseError(`Response header "${name}" has a value that cannot be sent (not a string, or with CR, LF or NUL).`);
      headers.push([name, text]);
    }
  }
  // HTTP gives these statuses no body; Express and Fastify drop one, and the Fetch API's
  // Response (NestJS's path) throws on one after the handler's writes committed: dropped here, so
  // every framework answers, stores and replays the same.
  const { bytes, contentType } = NO_BODY_STATUSES.has(status) ? { bytes: undefined, contentType: undefined } : bodyBytes(response.body);
  if (bytes && bytes.length > maxBodyBytes) {
    throw new UnsendableResponseError(`The response body is ${bytes.length} bytes; at most ${maxBodyBytes} are stored (maxResponseBytes). Answer with less, or link to the rest.`);
  }
  if (bytes && contentType && !headers.some(([name]) => name === 'content-type')) headers.push(['content-type', contentType]);
  const textBytes = bytes !== undefined && isUtf8(bytes) && !bytes.includes(0) ? jsonTextBytes(bytes) : Number.POSITIVE_INFINITY;
  const body = bytes === undefined ? null : textBytes <= base64Bytes(bytes.length) ? { text: bytes.toString('utf8') } : { base64: bytes.toString('base64') };
  const stored: StoredResponse = { status, headers, body };
  // Measured as the key's maxResultBytes measures it (the JSON text's bytes), without writing the body out twice.
  const headerBytes = Buffer.byteLength(JSON.stringify(headers)) - '[]'.length;
  const bodyStoredBytes = body === null ? 0 : 'text' in body ? TEXT_WRAPPING_BYTES + textBytes : BASE64_WRAPPING_BYTES + body.base64.length;
  const storedBytes = ENVELOPE_BYTES + headerBytes + bodyStoredBytes;
  if (storedBytes > maxStoredBytes) {
    throw new UnsendableResponseError(
      `The response takes ${storedBytes} bytes once stored, ${headerBytes} of them its headers, more than the ${maxStoredBytes} its key can store ` +
        `(maxResultBytes of the IdempotencyKeys; a body within maxResponseBytes always fits with up to ${STORED_HEADERS_ALLOWANCE_BYTES} bytes of headers). ` +
        'Answer with fewer or shorter headers, or raise maxResultBytes.',
    );
  }
  return { stored, answer: decodeResponse(stored) };
}

/** The answer of a stored response (a replay, or the first answer as it was stored). */
export function decodeResponse(stored: StoredResponse): RequestAnswer {
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of stored.headers) {
    const before = headers[name];
    headers[name] = before === undefined ? value : Array.isArray(before) ? [...before, value] : [before, value];
  }
  const body = stored.body === null ? undefined : 'text' in stored.body ? Buffer.from(stored.body.text, 'utf8') : Buffer.from(stored.body.base64, 'base64');
  return { status: stored.status, headers, body };
}

/** True for what {@link encodeResponse} stored (a key's result read back). */
export function isStoredResponse(value: unknown): value is StoredResponse {
  if (value === null || typeof value !== 'object') return false;
  const record = value as Record<string, unknown>;
  return typeof record.status === 'number' && Array.isArray(record.headers) && (record.body === null || (typeof record.body === 'object' && record.body !== null));
}

/** Length of base64 of `n` bytes. */
function base64Bytes(n: number): number {
  return Math.ceil(n / 3) * 4;
}

/**
 * Bytes of UTF-8 text (without NUL) inside a JSON string, quotes left out: what `JSON.stringify`
 * writes for it. A quote and a backslash take two; of the control characters, backspace, tab,
 * line feed, form feed and carriage return two (`\n`), the others six (`\u0001`); every other
 * byte one (non-ASCII is written as it is).
 */
function jsonTextBytes(bytes: Buffer): number {
  let length = 0;
  for (const byte of bytes) {
    if (byte === 0x22 || byte === 0x5c) length += 2;
    else if (byte >= 0x20) length += 1;
    else length += byte === 0x08 || byte === 0x09 || byte === 0x0a || byte === 0x0c || byte === 0x0d ? 2 : 6;
  }
  return length;
}

function bodyBytes(body: unknown): { bytes: Buffer | undefined; contentType: string | undefined } {
  if (body === undefined) return { bytes: undefined, contentType: undefined };
  if (typeof body === 'string') return { bytes: Buffer.from(body, 'utf8'), contentType: 'text/plain; charset=utf-8' };
  if (body instanceof Uint8Array) return { bytes: Buffer.from(body.buffer, body.byteOffset, body.byteLength), contentType: 'application/octet-stream' };
  let json: string | undefined;
  try {
    json = JSON.stringify(body);
  } catch (error) {
    throw new UnsendableResponseError(`The response body cannot be written as JSON: ${(error as Error).message}`);
  }
  if (json === undefined) throw new UnsendableResponseError(`The response body cannot be written as JSON (a ${typeof body}).`);
  return { bytes: Buffer.from(json, 'utf8'), contentType: 'application/json; charset=utf-8' };
}
