import { existsSync, readFileSync } from 'node:fs';
import { Module } from 'node:module';
import { dirname, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { HANDLER_FORMS, isDatabaseOnlyHandler, type KeyedJobHandler } from '../consumer/database-only-handler.js';
import { ConfigError } from '../errors.js';

const TYPESCRIPT = /\.[cm]?tsx?$/;
/** Node's refusals of a TypeScript file: no type stripping (Node 20), or syntax it cannot strip. */
const TYPESCRIPT_REFUSED = new Set(['ERR_UNKNOWN_FILE_EXTENSION', 'ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX', 'ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING']);

/** How deep a handler may sit under `default` and `handler` properties (tsc's interop wraps it once or twice). */
const MAX_UNWRAP = 3;

/**
 * Loads a user's handler module (`--handler <module>` of `worker` and `consume`): its default
 * export is the handler, a function `async (ctx) => result` or a database-only handler
 * `{ transaction: async (tx, ctx) => result }`. An ES module's `export default`, and each form
 * of tsc's CommonJS output: `exports.default` (with `__esModule`), `module.exports = handler`,
 * `exports.handler`, a default nested in another, and a CommonJS file in a package whose
 * package.json says `"type": "module"`. A file that does not exist, a TypeScript file
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
    if (isCommonJsInEsmScope(error)) return { default: requireAsCommonJs(file) };
    throw loadError(path, file, error);
  })) as { default?: unknown; handler?: unknown };
  const found = handlerIn(module.default, 0) ?? handlerIn(module.handler, 0);
  if (found) return found;
  const handler = module.default;
  const what = handler === undefined ? 'the module has no default export' : `its default export is ${describe(handler)}`;
  throw new ConfigError(`--handler ${path}: ${what}; export default ${HANDLER_FORMS}.`);
}

/**
 * The handler in `value`: `value` itself, or one found under its `default` or `handler`
 * property. Importing CommonJS gives `module.exports` as the default, so tsc's `exports.default
 * = handler` arrives as `{ default: handler }`, and `exports.handler` as `{ handler }`.
 */
function handlerIn(value: unknown, depth: number): KeyedJobHandler<any, unknown, any> | undefined {
  if (typeof value === 'function') return value as KeyedJobHandler<any, unknown, any>;
  if (isDatabaseOnlyHandler(value)) return value;
  if (typeof value !== 'object' || value === null || depth >= MAX_UNWRAP) return undefined;
  const inner = value as { default?: unknown; handler?: unknown };
  return handlerIn(inner.default, depth + 1) ?? handlerIn(inner.handler, depth + 1);
}

/**
 * Node's refusal of CommonJS (tsc's `exports.…`, `require`) in a file it reads as an ES module:
 * a `.js` file in a package whose package.json says `"type": "module"`.
 */
function isCommonJsInEsmScope(error: unknown): boolean {
  return error instanceof ReferenceError && /\b(exports|require|module) is not defined in ES module scope/.test(error.message);
}

/** `file` run as the CommonJS module it was compiled to, whatever its package.json says; its `module.exports`. */
function requireAsCommonJs(file: string): unknown {
  const commonJs = new Module(file) as Module & { _compile(source: string, filename: string): void; paths: string[] };
  commonJs.filename = file;
  commonJs.paths = (Module as unknown as { _nodeModulePaths(dir: string): string[] })._nodeModulePaths(dirname(file));
  commonJs._compile(readFileSync(file, 'utf8'), file);
  return commonJs.exports;
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
