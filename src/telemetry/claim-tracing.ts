/**
 * Spans of the claim protocol ({@link IdempotencyKeys}): the claim and its outcome, the effect
 * transaction and its commit, the fast path's single transaction, release and failure. They
 * know nothing of brokers: whichever runner calls the protocol gets them, as children of its
 * active span.
 */
import { LeaseLostError } from '../errors.js';
import type { Claim, ClaimOutcome } from '../store/claim-outcome.js';
import { tracingOff, type Attributes, type Span } from './otel-api.js';
import { annotate, inSpan } from './spans.js';
import { ATTR, keyAttributes } from './trace-attributes.js';

/** What a span says of a claim's outcome: the outcome's kind, and the fence and attempt when held. */
function outcomeAttributes(outcome: { readonly kind: string } & Partial<Pick<Claim, 'fence' | 'attempts'>>): Attributes {
  return outcome.fence === undefined
    ? { [ATTR.outcome]: outcome.kind }
    : { [ATTR.outcome]: outcome.kind, [ATTR.fence]: outcome.fence, [ATTR.attempt]: outcome.attempts! };
}

function claimAttributes(claim: Claim): Attributes {
  return { ...keyAttributes(claim.scope, claim.key), [ATTR.fence]: claim.fence, [ATTR.attempt]: claim.attempts };
}

/** `claim`: one claim of a key; its outcome, fence and attempt as attributes. */
export function traceClaim(scope: string, key: string, queue: string | undefined, work: () => Promise<ClaimOutcome>): Promise<ClaimOutcome> {
  if (tracingOff()) return work();
  return inSpan('claim', { attributes: () => ({ ...keyAttributes(scope, key), ...(queue && { [ATTR.queue]: queue }) }) }, async (span) => {
    const outcome = await work();
    annotate(span, () => outcomeAttributes(outcome));
    return outcome;
  });
}

/**
 * `effect transaction`: the effect and the fenced completion in one transaction. A completion
 * refused because the key was taken over is a `fenced` event on it (the span is failed too:
 * the effect rolled back).
 */
export function traceEffectTransaction<T>(claim: Claim, grouped: boolean, work: () => Promise<T>): Promise<T> {
  if (tracingOff()) return work();
  return inSpan('effect transaction', { attributes: () => ({ ...claimAttributes(claim), [ATTR.groupCommit]: grouped }) }, async (span) => {
    try {
      return await work();
    } catch (error) {
      if (error instanceof LeaseLostError) span?.addEvent('fenced', { [ATTR.fence]: claim.fence });
      throw error;
    }
  });
}

/** `commit`: the completion's last statement and COMMIT (one round trip). */
export function traceCommit(work: () => Promise<void>): Promise<void> {
  if (tracingOff()) return work();
  return inSpan('commit', {}, () => work());
}

/** Whether spans are recorded now: a job that is not traced need not mark where its effect ended. */
export function claimSpansOn(): boolean {
  return !tracingOff();
}

/**
 * `commit` of a job in a group: from the end of its effect until its group's COMMIT settled it
 * (the group-mates' effects, the group's end, and any run again after a rolled-back group).
 */
export function traceGroupCommit<T>(settled: Promise<T>): Promise<T> {
  if (tracingOff()) return settled;
  return inSpan('commit', { attributes: () => ({ [ATTR.groupCommit]: true }) }, () => settled);
}

/**
 * `execute once`: the fast path's claim, effect and completion in one transaction; the
 * outcome `executed` (with fence and attempt) or the claim's when it was not held.
 */
export function traceExecuteOnce<R extends { readonly kind: string; readonly claim?: Claim }>(
  scope: string,
  key: string,
  queue: string | undefined,
  grouped: boolean,
  work: () => Promise<R>,
): Promise<R> {
  if (tracingOff()) return work();
  const attributes = () => ({ ...keyAttributes(scope, key), ...(queue && { [ATTR.queue]: queue }), [ATTR.groupCommit]: grouped });
  return inSpan('execute once', { attributes }, async (span: Span | undefined) => {
    const outcome = await work();
    annotate(span, () => outcomeAttributes({ kind: outcome.kind, fence: outcome.claim?.fence, attempts: outcome.claim?.attempts }));
    return outcome;
  });
}

/** `release` or `fail`: a held key given back or failed for good; `settled` false when the claim no longer owned it. */
export function traceReleaseOrFail(name: 'release' | 'fail', claim: Claim, work: () => Promise<boolean>): Promise<boolean> {
  if (tracingOff()) return work();
  return inSpan(name, { attributes: () => claimAttributes(claim) }, async (span) => {
    const settled = await work();
    annotate(span, () => ({ [ATTR.outcome]: settled ? (name === 'release' ? 'released' : 'failed') : 'fenced' }));
    return settled;
  });
}

/** `step <name>`: one call of `ctx.step`; its outcome `ran` or `replayed`. */
export function traceStep<T>(claim: Claim, name: string, position: number, work: () => Promise<[T, string]>): Promise<[T, string]> {
  if (tracingOff()) return work();
  const attributes = () => ({ ...claimAttributes(claim), [ATTR.step]: name, [ATTR.stepPosition]: position });
  return inSpan(`step ${name}`, { attributes }, async (span) => {
    const ran = await work();
    annotate(span, () => ({ [ATTR.outcome]: ran[1] }));
    return ran;
  });
}
