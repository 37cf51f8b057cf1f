/**
 * `--handler` loads every layout of tsc's CommonJS output: handlers written in TypeScript,
 * compiled by this repository's tsc with `--module commonjs` into a temporary directory, each
 * loaded by the CLI's handler loader (`loadHandlerModule`) in a package without `type`, with
 * `"type": "commonjs"` and with `"type": "module"` (where Node reads a `.js` file as an ES
 * module and tsc's `exports.default` is not defined).
 */
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');

/** Each form a handler module takes in TypeScript, and what tsc's CommonJS output makes of it. */
const SOURCES: Record<string, string> = {
  // exports.default = …, with __esModule
  'default-export.ts': 'export default async (ctx: { data: { n: number } }) => ({ doubled: ctx.data.n * 2 });\n',
  // module.exports = …
  'export-equals.ts': 'const handler = async (ctx: { data: { n: number } }) => ({ doubled: ctx.data.n * 2 });\nexport = handler;\n',
  // exports.handler = …
  'named-handler.ts': 'export const handler = async (ctx: { data: { n: number } }) => ({ doubled: ctx.data.n * 2 });\n',
  // exports.default = { default: … }: a default nested in another, as interop with a CommonJS module gives
  'nested-default.ts': 'const inner = { default: async (ctx: { data: { n: number } }) => ({ doubled: ctx.data.n * 2 }) };\nexport default inner;\n',
  // a database-only handler: exports.default = { transaction }
  'database-only.ts': 'export default { transaction: async (_tx: unknown, ctx: { data: { n: number } }) => ({ doubled: ctx.data.n * 2 }) };\n',
  // a .cts file: handler.cjs
  'common.cts': 'export default async (ctx: { data: { n: number } }) => ({ doubled: ctx.data.n * 2 });\n',
};
const OUTPUTS = ['default-export.js', 'export-equals.js', 'named-handler.js', 'nested-default.js', 'database-only.js', 'common.cjs'];
const LAYOUTS = { 'no "type"': undefined, '"type": "commonjs"': 'commonjs', '"type": "module"': 'module' } as const;

let work: string;
let compiled: string;

beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'ij-handler-cjs-'));
  compiled = join(work, 'compiled');
  for (const [name, text] of Object.entries(SOURCES)) {
    writeFileSync(join(work, name), text);
  }
  execFileSync(
    process.execPath,
    [TSC, '--module', 'commonjs', '--moduleResolution', 'node10', '--target', 'es2021', '--strict', '--skipLibCheck', '--outDir', compiled, ...Object.keys(SOURCES).map((name) => join(work, name))],
    { stdio: 'pipe' },
  );
}, 120_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

/** What the CLI's loader made of each compiled module, loaded in a Node process of its own. */
let loaded: Map<string, { result?: unknown; error?: string }>;

beforeAll(() => {
  const files: string[] = [];
  for (const type of Object.values(LAYOUTS)) {
    const dir = join(work, `layout-${type ?? 'none'}`);
    cpSync(compiled, dir, { recursive: true });
    if (type) writeFileSync(join(dir, 'package.json'), JSON.stringify({ type }));
    files.push(...OUTPUTS.map((output) => join(dir, output)));
  }
  const output = execFileSync(process.execPath, ['--import', 'tsx', join(ROOT, 'test/support/load-handlers.ts'), ...files], { cwd: ROOT, encoding: 'utf8' });
  loaded = new Map(
    output
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as { file: string; result?: unknown; error?: string })
      .map(({ file, ...rest }) => [file, rest]),
  );
}, 120_000);

describe.each(Object.entries(LAYOUTS))('tsc --module commonjs output, in a package with %s', (label, type) => {
  it.each(OUTPUTS)(`%s loads through the handler loader and runs (${label})`, (output) => {
    expect(loaded.get(join(work, `layout-${type ?? 'none'}`, output))).toEqual({ result: { doubled: 42 } });
  });
});
