import { createHash } from 'node:crypto';

/**
 * The fingerprint that tells "the same request" from another under one key: SHA-256 over the
 * method, the request target (path and query, as sent) and the body. A parsed JSON body is
 * written canonically (object keys sorted, numbers by their JavaScript spelling), so key order
 * and whitespace do not matter; text and bytes are taken as they are.
 *
 * Written by hand, iteratively, rather than with the keys' JSON fingerprinter: a client's body
 * may hold what RFC 8785 cannot (`1e400` parses as Infinity) or nest deeper than a recursive
 * walk's stack, and neither may turn into a 500.
 */
export function requestFingerprint(method: string, target: string, body: unknown): string {
  const hash = createHash('sha256');
  hash.update(`${method.toUpperCase()}\n${target}\n`);
  if (body === undefined) hash.update('none');
  else if (typeof body === 'string') hash.update('text\n').update(body);
  else if (body instanceof Uint8Array) hash.update('bytes\n').update(body);
  else {
    hash.update('json\n');
    writeCanonical(body, (text) => hash.update(text));
  }
  return hash.digest('hex');
}

/** Writes `value` as canonical JSON-like text, depth-first with an explicit stack (any depth). */
function writeCanonical(value: unknown, write: (text: string) => void): void {
  const pending: unknown[] = [value];
  while (pending.length > 0) {
    const item = pending.pop();
    if (item instanceof Closing) {
      write(item.text);
      continue;
    }
    if (item === null || item === undefined) write('null');
    else if (typeof item === 'string') write(JSON.stringify(item));
    else if (typeof item === 'number') write(Object.is(item, -0) ? '0' : String(item));
    else if (typeof item === 'boolean') write(item ? 'true' : 'false');
    else if (typeof item === 'bigint') write(`${item}n`);
    else if (Array.isArray(item)) {
      write('[');
      pending.push(CLOSE_ARRAY);
      for (let i = item.length - 1; i >= 0; i--) {
        pending.push(item[i]);
        if (i > 0) pending.push(COMMA);
      }
    } else if (typeof item === 'object') {
      write('{');
      pending.push(CLOSE_OBJECT);
      const names = Object.keys(item).sort();
      for (let i = names.length - 1; i >= 0; i--) {
        pending.push((item as Record<string, unknown>)[names[i]!]);
        pending.push(new Closing(`${i > 0 ? ',' : ''}${JSON.stringify(names[i])}:`));
      }
    } else write(JSON.stringify(String(item)));
  }
}

/** Literal text on the stack (a bracket, a comma, an object member's name). */
class Closing {
  constructor(readonly text: string) {}
}
const CLOSE_ARRAY = new Closing(']');
const CLOSE_OBJECT = new Closing('}');
const COMMA = new Closing(',');
