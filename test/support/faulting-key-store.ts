/**
 * A key store that faults chosen calls: a {@link KeyStore} wrapped so that a call of one of its
 * methods meets a transient store fault (SQLSTATE 40001, what a serialization failure raises)
 * before it reaches Postgres, or after Postgres applied it (its answer lost), or a crash: the
 * worker process dies there, and every later call of the store fails as a dead process's would.
 * `IdempotencyKeys` takes it as its store (`new IdempotencyKeys(options, faultingKeyStore(…))`).
 */
import type { KeyStore } from '../../src/store/index.js';

/** Where a call meets its fault: `before` Postgres saw it, or `after` Postgres applied it. */
export type FaultTiming = 'before' | 'after';

/** What a call comes to: a transient fault or a crash, before or after it reached Postgres. */
export interface CallFault {
  readonly kind: 'transient' | 'crash';
  readonly timing: FaultTiming;
}

/** The fault of the `call`-th call (from 1) of `method`, or undefined to let it through. */
export type FaultPlan = (method: string, call: number) => CallFault | undefined;

/** A serialization failure, as node-postgres reports it: the store classifies it as transient. */
export function serializationFailure(method: string): Error {
  return Object.assign(new Error(`could not serialize access due to concurrent update (injected at ${method})`), { code: '40001' });
}

/** Thrown by a crashed store's calls: no store fault, so the runner rejects, as a dead process ends. */
export class InjectedCrash extends Error {
  constructor(method: string) {
    super(`the worker crashed at ${method} (injected)`);
    this.name = 'InjectedCrash';
  }
}

/** The methods whose calls are counted and may fault: those that send a statement to Postgres. */
const FAULTABLE = new Set([
  'coalesceArrive',
  'coalesceNext',
  'claim',
  'claimNewKey',
  'complete',
  'completeAndCommit',
  'storeFastPathResult',
  'storeFastPathResultAndCommit',
  'extend',
  'release',
  'fail',
  'get',
  'findSettled',
  'acquireSlot',
  'releaseSlot',
  'renewSlots',
]);

/** Sees each call that reaches Postgres: `before` it is sent, `applied` once Postgres answered (also when an `after` fault then hides the answer). */
export interface CallObserver {
  before?(method: string, args: readonly unknown[]): void;
  applied?(method: string, args: readonly unknown[], answer: unknown): void;
}

/** A store faulting calls as `plan` says; `crashed()` tells whether a crash has happened. */
export interface FaultingKeyStore extends KeyStore {
  crashed(): boolean;
  /** Calls of each method so far. */
  calls(): ReadonlyMap<string, number>;
}

/** `store`, with its calls faulted as `plan` says. */
export function faultingKeyStore(store: KeyStore, plan: FaultPlan, observer: CallObserver = {}): FaultingKeyStore {
  const calls = new Map<string, number>();
  let crashed = false;
  return new Proxy(store as FaultingKeyStore, {
    get(target, property, receiver) {
      if (property === 'crashed') return () => crashed;
      if (property === 'calls') return () => calls;
      const value = Reflect.get(target, property, receiver) as unknown;
      if (typeof property !== 'string' || typeof value !== 'function') return value;
      if (!FAULTABLE.has(property)) return value.bind(target);
      return async (...args: unknown[]) => {
        if (crashed) throw new InjectedCrash(property);
        const call = (calls.get(property) ?? 0) + 1;
        calls.set(property, call);
        const fault = plan(property, call);
        const failure = () => {
          if (fault!.kind === 'crash') {
            crashed = true;
            return new InjectedCrash(property);
          }
          return serializationFailure(property);
        };
        if (fault?.timing === 'before') throw failure();
        observer.before?.(property, args);
        const answer = await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
        observer.applied?.(property, args, answer);
        if (fault?.timing === 'after') throw failure();
        return answer;
      };
    },
  });
}
