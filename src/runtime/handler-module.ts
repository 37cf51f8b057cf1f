import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { HANDLER_FORMS, isDatabaseOnlyHandler, type KeyedJobHandler } from '../consumer/database-only-handler.js';
import { ConfigError } from '../errors.js';

/**
 * Loads a user's handler module (`--handler <module>` of `worker` and `consume`): its default
 * export is the handler, a function `async (ctx) => result` or a database-only handler
 * `{ transaction: async (tx, ctx) => result }`. Anything else is a {@link ConfigError} naming
 * the module and the two forms.
 */
export async function loadHandlerModule(path: string): Promise<KeyedJobHandler<any, unknown, any>> {
  const module = (await import(pathToFileURL(resolve(path)).href)) as { default?: unknown };
  const handler = module.default;
  if (typeof handler === 'function') return handler as KeyedJobHandler<any, unknown, any>;
  if (isDatabaseOnlyHandler(handler)) return handler;
  const found = handler === undefined ? 'the module has no default export' : `its default export is ${describe(handler)}`;
  throw new ConfigError(`--handler ${path}: ${found}; export default ${HANDLER_FORMS}.`);
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'object') return 'an object without a transaction function';
  return `a ${typeof value}`;
}
