/**
 * Runs one statement for many concurrent callers. Requests that arrive while fewer than
 * `maxInFlight` statements run go out together at the end of the event loop's turn in which the
 * first of them arrived (a lone request alone, so it costs what it always did); requests that
 * arrive while `maxInFlight` run wait for one to finish and then go out together, at most
 * `maxBatch` per statement. Nothing waits on a clock: the turn's end is a `setImmediate`
 * (so a test that fakes `setImmediate` must advance it), and under load concurrent requests
 * batch themselves.
 *
 * *Why the turn:* callers that a single answer sets going (a batch of claims answered, a group
 * committed) submit their next requests in the same turn, one after another. Sent at once, the
 * first `maxInFlight` of them went out alone, each a statement and a commit of its own, and the
 * rest together after them; gathered to the turn's end, they go as one.
 */
export class StatementBatcher<I, O> {
  readonly #run: (inputs: I[]) => Promise<O[]>;
  readonly #maxBatch: number;
  readonly #maxInFlight: number;
  #queue: Array<{ input: I; resolve: (output: O) => void; reject: (error: unknown) => void }> = [];
  #running = 0;
  /** A drain is due at the end of this turn. */
  #drainDue = false;

  /**
   * `run` must return one output per input, in order; if it throws, or answers with another
   * number of outputs, every caller of that batch gets an error.
   */
  constructor(run: (inputs: I[]) => Promise<O[]>, options: { maxBatch: number; maxInFlight: number }) {
    if (!(Number.isInteger(options.maxBatch) && options.maxBatch >= 1) || !(Number.isInteger(options.maxInFlight) && options.maxInFlight >= 1)) {
      throw new RangeError(`StatementBatcher needs maxBatch and maxInFlight of at least 1 (got ${options.maxBatch} and ${options.maxInFlight})`);
    }
    this.#run = run;
    this.#maxBatch = options.maxBatch;
    this.#maxInFlight = options.maxInFlight;
  }

  /** Queues `input` and resolves with its output. */
  submit(input: I): Promise<O> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ input, resolve, reject });
      if (this.#running >= this.#maxInFlight || this.#drainDue) return;
      this.#drainDue = true;
      setImmediate(() => {
        this.#drainDue = false;
        // A turn of more than maxBatch requests fills every free statement, not only one: each
        // drain takes its batch before it first waits.
        while (this.#running < this.#maxInFlight && this.#queue.length > 0) void this.#drain();
      });
    });
  }

  async #drain(): Promise<void> {
    this.#running++;
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, this.#maxBatch);
        try {
          const outputs = await this.#run(batch.map((b) => b.input));
          if (outputs.length !== batch.length) throw new Error(`a batched statement answered ${outputs.length} outputs for ${batch.length} requests`);
          batch.forEach((b, i) => b.resolve(outputs[i]!));
        } catch (error) {
          for (const b of batch) b.reject(error);
        }
      }
    } finally {
      this.#running--;
    }
  }
}
