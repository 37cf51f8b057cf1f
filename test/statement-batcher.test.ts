/**
 * The statement batcher under the claims, the settled-key probes and the slot rows: requests of
 * one event-loop turn go out as one statement; a lone request goes alone; at most `maxInFlight`
 * statements run, and what arrives meanwhile goes together after one of them; each caller gets its
 * own output, or its batch's error.
 */
import { describe, expect, it } from 'vitest';
import { StatementBatcher } from '../src/store/statement-batcher.js';

/** A batcher whose statements are recorded and answered when the test says. */
function recorded(options = { maxBatch: 64, maxInFlight: 2 }) {
  const statements: Array<{ inputs: number[]; answer: (error?: Error) => void }> = [];
  const batcher = new StatementBatcher<number, number>(
    (inputs) =>
      new Promise((resolve, reject) => {
        statements.push({ inputs, answer: (error) => (error ? reject(error) : resolve(inputs.map((n) => n * 10))) });
      }),
    options,
  );
  return { batcher, statements };
}

const turn = () => new Promise((resolve) => setImmediate(resolve));

describe('StatementBatcher', () => {
  it("sends the requests of one turn as one statement (the first two used to go alone), each caller getting its own output", async () => {
    const { batcher, statements } = recorded();
    const outputs = Promise.all([1, 2, 3, 4, 5].map((n) => batcher.submit(n)));
    await turn();
    expect(statements.map((s) => s.inputs)).toEqual([[1, 2, 3, 4, 5]]);
    statements[0]!.answer();
    expect(await outputs).toEqual([10, 20, 30, 40, 50]);
  });

  it('sends a lone request alone, and a second turn\'s beside the first while fewer than maxInFlight run', async () => {
    const { batcher, statements } = recorded();
    const first = batcher.submit(1);
    await turn();
    const second = batcher.submit(2);
    await turn();
    expect(statements.map((s) => s.inputs)).toEqual([[1], [2]]);
    statements.forEach((s) => s.answer());
    expect([await first, await second]).toEqual([10, 20]);
  });

  it('holds what arrives while maxInFlight statements run, and sends it together, at most maxBatch a statement, once one ends', async () => {
    const { batcher, statements } = recorded({ maxBatch: 3, maxInFlight: 2 });
    const early = [batcher.submit(1)];
    await turn();
    early.push(batcher.submit(2));
    await turn();
    const late = [3, 4, 5, 6].map((n) => batcher.submit(n));
    await turn();
    expect(statements.map((s) => s.inputs)).toEqual([[1], [2]]);
    statements[0]!.answer();
    await turn();
    expect(statements.map((s) => s.inputs)).toEqual([[1], [2], [3, 4, 5]]);
    statements[2]!.answer();
    await turn();
    expect(statements.map((s) => s.inputs)).toEqual([[1], [2], [3, 4, 5], [6]]);
    statements[1]!.answer();
    statements[3]!.answer();
    expect(await Promise.all([...early, ...late])).toEqual([10, 20, 30, 40, 50, 60]);
  });

  it('sends a turn of more than maxBatch requests as up to maxInFlight statements at once, not one after another', async () => {
    const { batcher, statements } = recorded({ maxBatch: 3, maxInFlight: 2 });
    const outputs = Promise.all([1, 2, 3, 4, 5, 6, 7].map((n) => batcher.submit(n)));
    await turn();
    // With one drain started per turn, [4, 5, 6] waited behind [1, 2, 3] (a statement stuck on a lock held them all).
    expect(statements.map((s) => s.inputs)).toEqual([[1, 2, 3], [4, 5, 6]]);
    statements[1]!.answer();
    await turn();
    expect(statements.map((s) => s.inputs)).toEqual([[1, 2, 3], [4, 5, 6], [7]]);
    statements[0]!.answer();
    statements[2]!.answer();
    expect(await outputs).toEqual([10, 20, 30, 40, 50, 60, 70]);
  });

  it('rejects every caller of a statement that answered another number of outputs than it had requests', async () => {
    const answers = [[10], [30, 40]];
    const batcher = new StatementBatcher<number, number>(async () => answers.shift()!, { maxBatch: 64, maxInFlight: 2 });
    const short = [batcher.submit(1), batcher.submit(2)].map((p) => p.catch((error: Error) => error.message));
    expect(await Promise.all(short)).toEqual(['a batched statement answered 1 outputs for 2 requests', 'a batched statement answered 1 outputs for 2 requests']);
    expect(await Promise.all([batcher.submit(3), batcher.submit(4)])).toEqual([30, 40]);
  });

  it('refuses a maxBatch or maxInFlight below 1 (a batcher that could never send)', () => {
    const run = async (inputs: number[]) => inputs;
    expect(() => new StatementBatcher(run, { maxBatch: 0, maxInFlight: 2 })).toThrow(/at least 1 \(got 0 and 2\)/);
    expect(() => new StatementBatcher(run, { maxBatch: 64, maxInFlight: 0 })).toThrow(RangeError);
  });

  it("gives a failed statement's error to every caller of that batch, and goes on with the next", async () => {
    const { batcher, statements } = recorded();
    const failing = [batcher.submit(1), batcher.submit(2)].map((p) => p.catch((error: Error) => error.message));
    await turn();
    statements[0]!.answer(new Error('deadlock detected'));
    expect(await Promise.all(failing)).toEqual(['deadlock detected', 'deadlock detected']);
    const next = batcher.submit(3);
    await turn();
    statements[1]!.answer();
    expect(await next).toBe(30);
  });
});
