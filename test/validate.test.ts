import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ValidationError } from '../src/index.js';
import { MAX_STORED_ERROR_MESSAGE_LENGTH, assertValidKeyPart, jsonbRefuses, serializePayload, toStoredError } from '../src/protocol/validate.js';

/** What the worker stores for a failure: must never throw, and `jsonb` must accept it. */
function storedJson(thrown: unknown): string {
  return JSON.stringify(toStoredError(thrown));
}

/** Text with NUL characters and lone surrogates mixed in (`fc.string` rarely makes them). */
const hostileText = fc
  .array(fc.oneof(fc.string(), fc.constantFrom('\u0000', '\ud800', '\udfff', '\ud83d', '\ude00', '\ud83d\ude00', '\\u0000', '\\')), { maxLength: 20 })
  .map((parts) => parts.join(''));

/** Values a handler might throw, hostile ones included. */
const thrown = fc.oneof(
  fc.anything(),
  hostileText,
  hostileText.map((message) => new Error(message)),
  fc.record({ message: hostileText, name: hostileText, code: hostileText }).map(({ message, name, code }) => Object.assign(new TypeError(message), { name, code })),
  hostileText.map((message) => new Error(message, { cause: new Error(message) })),
  fc.constantFrom<unknown>(Symbol('thrown'), 10n, undefined, null, () => 'fn', Object.create(null), [1, [2, [3]]]),
);

describe('toStoredError', () => {
  it('1. never throws, and its JSON is always storable in jsonb (no NUL, no lone surrogate) within the length cap', () => {
    fc.assert(
      fc.property(thrown, (value) => {
        const json = storedJson(value);
        expect(jsonbRefuses(json)).toBe(false);
        const stored = JSON.parse(json) as { name: unknown; message: unknown };
        expect(typeof stored.name).toBe('string');
        expect(typeof stored.message).toBe('string');
        expect((stored.message as string).length).toBeLessThanOrEqual(MAX_STORED_ERROR_MESSAGE_LENGTH);
      }),
      { numRuns: 2000 },
    );
  });

  it('2. a NUL or lone surrogate becomes U+FFFD; paired surrogates and the rest of the message are kept', () => {
    let parseError: unknown;
    try {
      JSON.parse('\u0000binary');
    } catch (error) {
      parseError = error;
    }
    expect(jsonbRefuses(JSON.stringify((parseError as Error).message))).toBe(true); // V8 quotes the raw NUL
    expect(toStoredError(parseError)).toMatchObject({ name: 'SyntaxError' });
    expect(toStoredError(parseError).message).not.toContain('\u0000');
    expect(toStoredError(new Error('bad \u0000 byte'))).toEqual({ name: 'Error', message: 'bad \ufffd byte' });
    expect(toStoredError(new Error('lone \ud800 high, lone \udc00 low, pair \ud83d\ude00'))).toEqual({
      name: 'Error',
      message: 'lone \ufffd high, lone \ufffd low, pair \ud83d\ude00',
    });
    expect(toStoredError(Object.assign(new Error('x'), { code: 'E\u0000' }))).toEqual({ name: 'Error', message: 'x', code: 'E\ufffd' });
    expect(toStoredError('thrown \u0000 string')).toEqual({ name: 'Error', message: 'thrown \ufffd string' });
  });

  it('3. a long message is cut at the cap, says so, and is never cut inside a surrogate pair', () => {
    const stored = toStoredError(new Error('x'.repeat(100_000)));
    expect(stored.message.length).toBeLessThanOrEqual(MAX_STORED_ERROR_MESSAGE_LENGTH);
    expect(stored.message).toMatch(/^x+ … \[cut: 100000 characters in all\]$/);
    for (let shift = 0; shift < 40; shift++) {
      const cut = toStoredError(new Error('a'.repeat(shift) + '\ud83d\ude00'.repeat(MAX_STORED_ERROR_MESSAGE_LENGTH))).message;
      expect(jsonbRefuses(JSON.stringify(cut))).toBe(false);
      expect(cut.length).toBeLessThanOrEqual(MAX_STORED_ERROR_MESSAGE_LENGTH);
    }
  });

  it('4. getters that throw, Proxies, Symbols, cycles and objects that cannot become text are described, not rethrown', () => {
    const throwingMessage = new Error('hidden');
    Object.defineProperty(throwingMessage, 'message', { get: () => { throw new Error('getter'); } });
    Object.defineProperty(throwingMessage, 'code', { get: () => { throw new Error('getter'); } });
    expect(toStoredError(throwingMessage)).toEqual({ name: 'Error', message: '(unreadable)' });

    const throwingName = new Error('visible');
    Object.defineProperty(throwingName, 'name', { get: () => { throw new Error('getter'); } });
    expect(toStoredError(throwingName)).toEqual({ name: '(unreadable)', message: 'visible' });

    const hostileProxy = new Proxy({}, { getPrototypeOf: () => { throw new Error('trap'); }, get: () => { throw new Error('trap'); } });
    expect(() => toStoredError(hostileProxy)).not.toThrow();

    const cyclic: Record<string, unknown> = { name: 'loop' };
    cyclic.self = cyclic;
    const cyclicCause = new Error('outer');
    (cyclicCause as { cause?: unknown }).cause = cyclicCause;
    expect(toStoredError(cyclic)).toEqual({ name: 'Error', message: '[object Object]' });
    expect(toStoredError(cyclicCause)).toEqual({ name: 'Error', message: 'outer' });
    expect(toStoredError(Symbol('why'))).toEqual({ name: 'Error', message: 'Symbol(why)' });
    expect(toStoredError(Object.create(null))).toEqual({ name: 'Error', message: '{}' });
    const noText = { toJSON: () => { throw new Error('no json'); }, [Symbol.toPrimitive]: () => { throw new Error('no text'); } };
    expect(toStoredError(noText)).toEqual({ name: 'Error', message: '(unreadable)' });
    expect(toStoredError(12n)).toEqual({ name: 'Error', message: '12' });
  });
});

describe('serializePayload', () => {
  it('5. refuses a payload jsonb cannot store, naming scope, key and what is wrong', () => {
    const cases: Array<[unknown, RegExp]> = [
      [{ text: 'a\u0000b' }, /NUL character/],
      [['\ud800'], /lone UTF-16 surrogate/],
      [{ big: 1n }, /not JSON-serialisable/],
      [() => 1, /a function is not JSON-serialisable/],
    ];
    for (const [payload, reason] of cases) {
      let error: unknown;
      try {
        serializePayload('shop', 'order-9', payload);
      } catch (thrownError) {
        error = thrownError;
      }
      expect(error).toBeInstanceOf(ValidationError);
      expect(error).toMatchObject({ code: 'INVALID_JOB_DATA', field: 'payload' });
      expect((error as Error).message).toMatch(/"order-9" in scope "shop"/);
      expect((error as Error).message).toMatch(reason);
    }
    expect(serializePayload('shop', 'order-9', { ok: 'pair \ud83d\ude00, escaped \\u0000' })).toBe('{"ok":"pair \ud83d\ude00, escaped \\\\u0000"}');
  });
});

describe('assertValidKeyPart', () => {
  // Postgres receives text as UTF-8, where node-postgres writes every lone surrogate as U+FFFD:
  // keys that differ only there would share one row, and the second job would replay the first.
  it.each([
    ['key', 'order-\ud800'],
    ['key', 'order-\udfff-42'],
    ['scope', '\udc00acme'],
  ] as const)('refuses a %s holding a lone surrogate (%j)', (field, value) => {
    expect(() => assertValidKeyPart(field, value)).toThrow(/lone UTF-16 surrogate/);
    expect(() => assertValidKeyPart(field, value)).toThrow(ValidationError);
  });

  it('accepts paired surrogates (a character outside the BMP) and other Unicode', () => {
    for (const value of ['order-😀', 'bestellung-ü-42', '注文-42']) expect(() => assertValidKeyPart('key', value)).not.toThrow();
  });
});
