import { describe, expect, it } from 'vitest';
import { RunAbort } from '../src/consumer/run-abort.js';

describe('RunAbort: a run\'s cancellation, its signal made when read', () => {
  it('a signal read before the abort fires with its reason', () => {
    const cancellation = new RunAbort();
    const signal = cancellation.signal;
    let fired: unknown;
    signal.addEventListener('abort', () => (fired = signal.reason));
    cancellation.abort('lease lost');
    expect(signal.aborted).toBe(true);
    expect(fired).toBe('lease lost');
    expect(cancellation.signal).toBe(signal);
  });

  it('a signal read after the abort is born aborted, with the reason; the first reason stays', () => {
    const cancellation = new RunAbort();
    cancellation.abort('first');
    cancellation.abort('second');
    expect(cancellation.aborted).toBe(true);
    expect(cancellation.reason).toBe('first');
    expect(cancellation.signal.aborted).toBe(true);
    expect(cancellation.signal.reason).toBe('first');
  });

  it('the broker\'s cancellation aborts the run, whether or not its signal was read yet', () => {
    const unread = new AbortController();
    const notYetRead = new RunAbort(unread.signal);
    expect(notYetRead.aborted).toBe(false);
    unread.abort('broker cancelled');
    expect(notYetRead.aborted).toBe(true);
    expect(notYetRead.reason).toBe('broker cancelled');
    expect(notYetRead.signal.reason).toBe('broker cancelled');

    const read = new AbortController();
    const alreadyRead = new RunAbort(read.signal);
    const signal = alreadyRead.signal;
    read.abort('broker cancelled');
    expect(signal.aborted).toBe(true);
    expect(signal.reason).toBe('broker cancelled');
  });

  it('a broker cancellation that came first keeps its reason over a later abort', () => {
    const broker = new AbortController();
    const cancellation = new RunAbort(broker.signal);
    broker.abort('broker cancelled');
    cancellation.abort('lease lost');
    expect(cancellation.reason).toBe('broker cancelled');
    expect(cancellation.signal.reason).toBe('broker cancelled');
  });

  it('an abort before the broker\'s keeps its own reason', () => {
    const broker = new AbortController();
    const cancellation = new RunAbort(broker.signal);
    const signal = cancellation.signal;
    cancellation.abort('worker closing');
    broker.abort('broker cancelled');
    expect(cancellation.reason).toBe('worker closing');
    expect(signal.reason).toBe('worker closing');
  });
});
