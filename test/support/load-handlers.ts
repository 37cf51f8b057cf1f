/**
 * Loads each handler module named on the command line with the CLI's loader, as
 * `idempotent-jobs worker --handler` does in a real Node process (not through the test
 * runner's module system), runs it on `{ data: { n: 21 } }` and prints one JSON line per module:
 * `{ file, result }` or `{ file, error }`.
 */
import { loadHandlerModule } from '../../src/process/index.js';

for (const file of process.argv.slice(2)) {
  try {
    const handler = await loadHandlerModule(file);
    const ctx = { data: { n: 21 } };
    const result = typeof handler === 'function' ? await (handler as (ctx: unknown) => Promise<unknown>)(ctx) : await (handler as { transaction(tx: unknown, ctx: unknown): Promise<unknown> }).transaction(undefined, ctx);
    console.log(JSON.stringify({ file, result }));
  } catch (error) {
    console.log(JSON.stringify({ file, error: (error as Error).message }));
  }
}
