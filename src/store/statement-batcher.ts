/**
 * Runs one statement for many concurrent callers. A request that arrives while fewer than
 * `maxInFlight` statements run goes out at once (alone, so a lone request costs what it always
 * did); requests that arrive meanwhile wait for a running statement to finish and then go out
 * together, at most `maxBatch` per statement. Nothing waits on a timer: under load, concurrent
 * requests batch themselves.
 */
export class StatementBatcher<I, O> {
  readonly #run: (inputs: I[]) => Promise<O[]>;
  readonly #maxBatch: number;
  readonly #maxInFlight: number;
  #queue: Array<{ input: I; resolve: (output: O) => void; reject: (error: unknown) => void }> = [];
  #running = 0;

  /** `run` must return one output per input, in order; if it throws, every caller of that batch gets the error. */
  constructor(run: (inputs: I[]) => Promise<O[]>, options: { maxBatch: number; maxInFlight: number }) {
    this.#run = run;
    this.#maxBatch = options.maxBatch;
    this.#maxInFlight = options.maxInFlight;
  }

  /** Queues `input` and resolves with its output. */
  submit(input: I): Promise<O> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ input, resolve, reject });
      if (this.#running < this.#maxInFlight) void this.#drain();
    });
  }

  async #drain(): Promise<void> {
    this.#running++;
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, this.#maxBatch);
        try {
          const outputs = await this.#run(batch.map((b) => b.input));
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
