/**
 * docs/configuration.md documents every environment variable the repository reads: the
 * variables of the schemas in src/config, each with its default as the code has it, and every
 * other one the code reads (`process.env.X` in TypeScript, `${X:-…}` in shell scripts,
 * `os.environ` in Python). A variable counts as documented when it is named, in backticks, in
 * the first cell of a table row; the row's second cell is its default.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { extname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ENV_VARIABLES, loadEnvConfig } from '../src/runtime/env-config.js';
import { HTTP_ENV_VARIABLES, loadHttpEnvConfig } from '../src/runtime/http-env-config.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const THIS_FILE = fileURLToPath(import.meta.url);
const DOC_PATH = join(ROOT, 'docs/configuration.md');
/** Where the code that reads the environment lives (directories, and the test runner's configuration). */
const CODE_ROOTS = ['src', 'workers', 'producers', 'demo', 'examples', 'test', 'bench', 'bin', '.ci', 'vitest.config.ts'];
const CODE_EXTENSIONS = new Set(['.ts', '.js', '.mjs', '.sh', '.py']);
/** Read by the OpenTelemetry SDK, not by this repository's code, and documented for that. */
const READ_BY_DEPENDENCIES = new Set(['OTEL_TRACES_SAMPLER', 'OTEL_RESOURCE_ATTRIBUTES']);

/** Variable name → its row's second cell (the default), for every table row of `markdown`. */
export function documentedVariables(markdown: string): Map<string, string> {
  const rows = new Map<string, string>();
  let inFence = false;
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) inFence = !inFence;
    if (inFence || !line.startsWith('|')) continue;
    const cells = line.split(/(?<!\\)\|/).slice(1, -1).map((cell) => cell.trim());
    if (cells.length < 2) continue;
    for (const [, name] of cells[0]!.matchAll(/`([A-Z][A-Z0-9_]*)`/g)) rows.set(name!, cells[1]!);
  }
  return rows;
}

/** The environment variables a source file reads, by the patterns of its language. */
export function variablesReadIn(text: string, extension: string): string[] {
  const names: string[] = [];
  const collect = (pattern: RegExp) => {
    for (const match of text.matchAll(pattern)) names.push(match[1]!);
  };
  if (extension === '.sh' || extension === '') {
    collect(/\$\{([A-Z][A-Z0-9_]*):?[-?=+]/g);
  } else if (extension === '.py') {
    collect(/os\.environ(?:\.get\(\s*|\[\s*)["']([A-Z][A-Z0-9_]*)["']/g);
  } else {
    collect(/\b(?:process\.)?env\.([A-Z][A-Z0-9_]*)\b/g);
    collect(/process\.env\[\s*['"]([A-Z][A-Z0-9_]*)['"]\s*\]/g);
    for (const [, list] of text.matchAll(/\{([^{}]*)\}\s*=\s*process\.env\b/g)) {
      for (const [, name] of list!.matchAll(/\b([A-Z][A-Z0-9_]*)\s*(?=[:,]|$)/g)) names.push(name!);
    }
  }
  return names;
}

/** Every variable read by the repository's code, with the first file that reads it. */
function variablesReadByTheCode(): Map<string, string> {
  const found = new Map<string, string>();
  const visit = (path: string) => {
    const stat = statSync(path);
    if (stat.isDirectory()) {
      for (const entry of readdirSync(path)) {
        if (entry !== 'node_modules' && entry !== 'results') visit(join(path, entry));
      }
      return;
    }
    // This file's examples of the patterns are not variables.
    if (path === THIS_FILE) return;
    const extension = extname(path);
    const text = readFileSync(path, 'utf8');
    // Extension-less files are scripts when they start with a shebang (.ci/run).
    if (!CODE_EXTENSIONS.has(extension) && !(extension === '' && text.startsWith('#!'))) return;
    for (const name of variablesReadIn(text, extension)) {
      if (!found.has(name)) found.set(name, relative(ROOT, path));
    }
  };
  for (const root of CODE_ROOTS) visit(join(ROOT, root));
  return found;
}

/** The defaults the schemas apply when a variable is unset (those that have one). */
function schemaDefaults(): Map<string, string> {
  const defaults = new Map<string, string>();
  const resolved: Record<string, unknown> = { ...loadEnvConfig({}), ...loadHttpEnvConfig({}) };
  for (const name of [...ENV_VARIABLES, ...HTTP_ENV_VARIABLES]) {
    const value = resolved[name];
    if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') defaults.set(name, String(value));
  }
  return defaults;
}

/** What is wrong with `markdown` as the configuration reference: one line per problem. */
function configurationDocProblems(markdown: string, readByCode: ReadonlyMap<string, string>): string[] {
  const documented = documentedVariables(markdown);
  const problems: string[] = [];
  for (const name of [...ENV_VARIABLES, ...HTTP_ENV_VARIABLES]) {
    if (!documented.has(name)) problems.push(`${name}: in the schema (src/config), not in docs/configuration.md`);
  }
  for (const [name, file] of readByCode) {
    if (!documented.has(name)) problems.push(`${name}: read by ${file}, not in docs/configuration.md`);
  }
  for (const [name, value] of schemaDefaults()) {
    const cell = documented.get(name);
    if (cell !== undefined && !cell.includes(`\`${value}\``)) problems.push(`${name}: the schema's default is ${value}, the doc says ${cell}`);
  }
  const known = new Set<string>([...ENV_VARIABLES, ...HTTP_ENV_VARIABLES, ...readByCode.keys(), ...READ_BY_DEPENDENCIES]);
  for (const name of documented.keys()) {
    if (!known.has(name)) problems.push(`${name}: documented, but nothing reads it`);
  }
  return problems;
}

describe('docs/configuration.md', () => {
  const doc = readFileSync(DOC_PATH, 'utf8');
  const readByCode = variablesReadByTheCode();

  it('documents every variable of the schemas and every one the code reads, with the schemas\' defaults', () => {
    expect(readByCode.size).toBeGreaterThan(20);
    expect(configurationDocProblems(doc, readByCode)).toEqual([]);
  });

  it('fails when a variable\'s row is missing', () => {
    for (const name of ['LEASE_MS', 'HTTP_TOKENS', 'AMQP_URL']) {
      const withoutRow = doc.split('\n').filter((line) => !line.startsWith(`| \`${name}\``)).join('\n');
      expect(withoutRow).not.toBe(doc);
      expect(configurationDocProblems(withoutRow, readByCode).join('\n')).toContain(`${name}: `);
    }
  });

  it('fails when a documented default differs from the schema\'s', () => {
    const wrong = doc.replace('| `CONCURRENCY` | `8` |', '| `CONCURRENCY` | `4` |');
    expect(wrong).not.toBe(doc);
    expect(configurationDocProblems(wrong, readByCode)).toEqual([`CONCURRENCY: the schema's default is 8, the doc says \`4\``]);
  });

  it('fails on a row for a variable nothing reads', () => {
    const stale = `${doc}\n| \`NO_SUCH_VARIABLE\` | \`1\` | nothing |\n`;
    expect(configurationDocProblems(stale, readByCode)).toEqual(['NO_SUCH_VARIABLE: documented, but nothing reads it']);
  });

  it('finds variables read in TypeScript, shell and Python', () => {
    expect(variablesReadIn('const a = process.env.ONE ?? env.TWO; process.env["THREE"]; const { FOUR: four, FIVE } = process.env;', '.ts')).toEqual([
      'ONE',
      'TWO',
      'THREE',
      'FOUR',
      'FIVE',
    ]);
    expect(variablesReadIn('x="${SIX:-}" y=${SEVEN:?set it} z=$PATH ${1:-a}', '.sh')).toEqual(['SIX', 'SEVEN']);
    expect(variablesReadIn('os.environ.get("EIGHT", "x"); os.environ["NINE"]', '.py')).toEqual(['EIGHT', 'NINE']);
  });
});
