import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { HANDLER_FORMS, isDatabaseOnlyHandler, type KeyedJobHandler } from '../consumer/database-only-handler.js';
import { ConfigError } from '../errors.js';

const TYPESCRIPT = /\.[cm]?tsx?$/;
/** Node's refusals of a TypeScript file: no type stripping (Node 20), or syntax it cannot strip. */
const TYPESCRIPT_REFUSED = new Set(['ERR_UNKNOWN_FILE_EXTENSION', 'ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX', 'ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING']);

/**
 * Loads a user's handler module (`--handler <module>` of `worker` and `consume`): its default
 * export is the handler, a function `async (ctx) => result` or a database-only handler
 * `{ transaction: async (tx, ctx) => result }`. A file that does not exist, a TypeScript file
 * this Node cannot load, a module whose own imports are missing, and a default export of
 * neither form are each a {@link ConfigError} saying what to do, not Node's error from inside
 * the package.
 */
export async function loadHandlerModule(path: string): Promise<KeyedJobHandler<any, unknown, any>> {
  const file = resolve(path);
  if (!existsSync(file)) {
    throw new ConfigError(`--handler ${path}: no such file (${file}); give the handler module's path, absolute or relative to ${process.cwd()}.`);
  }
  const module = (await import(pathToFileURL(file).href).catch((error: unknown) => {
    throw loadError(path, file, error);
  })) as { default?: unknown };
  const handler = module.default;
  if (typeof handler === 'function') return handler as KeyedJobHandler<any, unknown, any>;
  if (isDatabaseOnlyHandler(handler)) return handler;
  const found = handler === undefined ? 'the module has no default export' : `its default export is ${describe(handler)}`;
  throw new ConfigError(`--handler ${path}: ${found}; export default ${HANDLER_FORMS}.`);
}

/** Node's error loading the module, as a ConfigError when it says something the user can fix. */
function loadError(path: string, file: string, error: unknown): unknown {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  if (code !== undefined && TYPESCRIPT_REFUSED.has(code) && TYPESCRIPT.test(file)) {
    return new ConfigError(
      `--handler ${path}: a TypeScript module, which Node ${process.version} does not load by itself. Compile it to JavaScript (tsc) ` +
        `and pass the .js file, or run the command through a TypeScript loader: npm install tsx, then ` +
        `node --import tsx node_modules/idempotent-jobs/bin/idempotent-jobs.js <command> --handler ${path}.`,
      { cause: error },
    );
  }
  if (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') {
    return new ConfigError(
      `--handler ${path}: the module imports something that cannot be found (${(error as Error).message.split('\n')[0]}); ` +
        'install the missing package in the project the handler belongs to, or fix the import.',
      { cause: error },
    );
  }
  return error;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'object') return 'an object without a transaction function';
  return `a ${typeof value}`;
}
