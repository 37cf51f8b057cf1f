/** What a run's failure handling reads of its abort: whether it was aborted, and why. */
export interface AbortState {
  readonly aborted: boolean;
  readonly reason: unknown;
}

/**
 * One run's cancellation: aborted when its lease is lost, when the worker gives up on it at
 * shutdown, or when the broker cancels the delivery.
 *
 * Its `AbortSignal` is made only when someone reads {@link RunAbort.signal} (the handler's
 * `ctx.signal`, steps): most handlers never do, and a signal, its controller and a listener on
 * the broker's signal cost every job some microseconds and a kilobyte of garbage. A signal made
 * after the abort is born aborted, with the same reason.
 */
export class RunAbort implements AbortState {
  readonly #broker: AbortSignal | undefined;
  #controller: AbortController | undefined;
  #aborted = false;
  #reason: unknown;

  /** `broker`: the broker's own cancellation of the delivery, if it has one. */
  constructor(broker?: AbortSignal) {
    this.#broker = broker;
  }

  get aborted(): boolean {
    return this.#aborted || this.#broker?.aborted === true;
  }

  get reason(): unknown {
    if (this.#aborted) return this.#reason;
    return this.#broker?.aborted ? this.#broker.reason : undefined;
  }

  /**
   * Aborts the run, firing the signal if one was made. The first reason stays: the broker's, if
   * it cancelled the delivery before.
   */
  abort(reason: unknown): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#reason = this.#broker?.aborted ? this.#broker.reason : reason;
    this.#controller?.abort(this.#reason);
  }

  get signal(): AbortSignal {
    if (this.#controller) return this.#controller.signal;
    const controller = (this.#controller = new AbortController());
    const broker = this.#broker;
    if (this.aborted) controller.abort(this.reason);
    else broker?.addEventListener('abort', () => this.abort(broker.reason), { once: true });
    return controller.signal;
  }
}
