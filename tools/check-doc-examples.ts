/**
 * Type-checks the TSDoc examples: every ```ts (or ```typescript) block inside an `@example` tag
 * of a source file the package's entry points reach, compiled as a module of its own with
 * `strict` on, the way a user would paste it into their project. Run by `npm run docs` before
 * TypeDoc; exits 1 naming each failing example's file and line, and the compiler's message.
 *
 * An example imports what it uses from 'idempotent-jobs' (or '/amqp', '/nats', '/otel'), which
 * resolve to `src/` here, and any other package the project has installed; an example of an
 * internal module (not exported to users) imports it relative to its own file, `'./x.js'`.
 * It may use the
 * application's own objects without declaring them: they are declared in
 * `tools/doc-examples/globals.d.ts` (`db`, `keys`, `producer`, …), so that an example shows the
 * library's part and not the set-up every other example repeats.
 *
 * Usage: `tsx tools/check-doc-examples.ts [--keep]` (`--keep` leaves the generated modules in
 * their temporary directory, with a tsconfig.json for running `tsc -p` by hand).
 */
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const ROOT = path.resolve(fileURLToPath(new URL('..', import.meta.url)));

/** The package's entry points (package.json "exports"), by the specifier users import. */
const ENTRY_POINTS: Readonly<Record<string, string>> = {
  'idempotent-jobs': 'src/index.ts',
  'idempotent-jobs/amqp': 'src/amqp/index.ts',
  'idempotent-jobs/nats': 'src/nats/index.ts',
  'idempotent-jobs/otel': 'src/otel/index.ts',
  'idempotent-jobs/process': 'src/process/index.ts',
  'idempotent-jobs/store': 'src/store/index.ts',
  'idempotent-jobs/pg': 'src/pg/index.ts',
  'idempotent-jobs/postgres-js': 'src/postgres-js/index.ts',
  'idempotent-jobs/drizzle': 'src/drizzle/index.ts',
  'idempotent-jobs/prisma': 'src/prisma/index.ts',
  'idempotent-jobs/typeorm': 'src/typeorm/index.ts',
  'idempotent-jobs/knex': 'src/knex/index.ts',
  'idempotent-jobs/mikro-orm': 'src/mikro-orm/index.ts',
  'idempotent-jobs/nestjs': 'src/nestjs/index.ts',
  'idempotent-jobs/bull-board': 'src/bull-board/index.ts',
  'idempotent-jobs/http-idempotency': 'src/http-idempotency/index.ts',
};

const GLOBALS = path.join(ROOT, 'tools/doc-examples/globals.d.ts');

/** One fenced block of an `@example`, and where it sits in its source file. */
interface Example {
  /** Path relative to the repository root. */
  readonly file: string;
  /** 1-based line of the block's first code line in `file`. */
  readonly line: number;
  readonly code: string;
}

const compilerOptions: ts.CompilerOptions = {
  strict: true,
  noEmit: true,
  // The NestJS examples are written as a Nest application's code is (its decorators).
  experimentalDecorators: true,
  target: ts.ScriptTarget.ES2022,
  lib: ['lib.es2023.d.ts'],
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  esModuleInterop: true,
  skipLibCheck: true,
  resolveJsonModule: true,
  types: ['node'],
  paths: Object.fromEntries(Object.entries(ENTRY_POINTS).map(([specifier, file]) => [specifier, [path.join(ROOT, file)]])),
};

/** The source files the entry points reach (their imports, transitively), outside node_modules. */
function reachableSourceFiles(): ts.SourceFile[] {
  const program = ts.createProgram(
    Object.values(ENTRY_POINTS).map((file) => path.join(ROOT, file)),
    { ...compilerOptions, paths: {} },
  );
  const src = path.join(ROOT, 'src') + path.sep;
  return program.getSourceFiles().filter((file) => path.resolve(file.fileName).startsWith(src) && !file.isDeclarationFile);
}

/**
 * The doc comments of a file, as [start, end) offsets: the leading comments of every node, found
 * from the parsed tree, so that a `/**` inside a string, template or regular expression is not
 * mistaken for one.
 */
function docCommentsOf(file: ts.SourceFile): Array<readonly [number, number]> {
  const found = new Map<number, number>();
  const visit = (node: ts.Node) => {
    for (const range of ts.getLeadingCommentRanges(file.text, node.getFullStart()) ?? []) {
      if (range.kind === ts.SyntaxKind.MultiLineCommentTrivia && file.text.startsWith('/**', range.pos)) found.set(range.pos, range.end);
    }
    ts.forEachChild(node, visit);
  };
  visit(file);
  visit(file.endOfFileToken);
  return [...found].sort(([a], [b]) => a - b);
}

/** The `@example` code blocks of one file. */
function examplesOf(file: ts.SourceFile): Example[] {
  const examples: Example[] = [];
  const relative = path.relative(ROOT, file.fileName);
  for (const [start, end] of docCommentsOf(file)) {
    const firstLine = file.getLineAndCharacterOfPosition(start).line;
    const lines = file.text
      .slice(start, end)
      .split('\n')
      .map((text) => text.replace(/^\s*\/\*\*\s?/, '').replace(/\s*\*\/\s*$/, '').replace(/^\s*\*( |$)/, ''));
    let inExample = false;
    let block: { start: number; lines: string[] } | undefined;
    lines.forEach((text, index) => {
      if (block) {
        if (/^\s*```\s*$/.test(text)) {
          examples.push({ file: relative, line: block.start + 1, code: block.lines.join('\n') + '\n' });
          block = undefined;
        } else {
          block.lines.push(text);
        }
        return;
      }
      const tag = /^\s*@(\w+)/.exec(text)?.[1];
      if (tag !== undefined) inExample = tag === 'example';
      if (inExample && /^\s*```(ts|typescript)\s*$/.test(text)) block = { start: firstLine + index + 1, lines: [] };
    });
    if (block) throw new Error(`${relative}:${block.start}: an @example code block is not closed with \`\`\``);
  }
  return examples;
}

/** The example's code, its relative imports made absolute (relative to its source file), lines unchanged. */
function withResolvedImports(example: Example): string {
  const dir = path.dirname(path.join(ROOT, example.file));
  return example.code.replace(/(\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)(['"])(\.\.?\/[^'"]+)\2/g, (_match, before: string, quote: string, specifier: string) => {
    return `${before}${quote}${path.join(dir, specifier)}${quote}`;
  });
}

/** A module file name for an example, unique and telling where it came from. */
function moduleNameOf(example: Example): string {
  return `${example.file.replace(/\.ts$/, '').replace(/[^A-Za-z0-9]+/g, '_')}_L${example.line}.ts`;
}

function main(): number {
  const keep = process.argv.includes('--keep');
  const examples = reachableSourceFiles().flatMap(examplesOf);
  if (examples.length === 0) {
    console.error('check-doc-examples: no @example code blocks found; is the extraction broken?');
    return 1;
  }

  const dir = mkdtempSync(path.join(tmpdir(), 'idempotent-jobs-doc-examples-'));
  try {
    // ESM, as the package is; node_modules for the examples' other imports (kysely, bullmq…).
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ type: 'module', private: true }, null, 2) + '\n');
    symlinkSync(path.join(ROOT, 'node_modules'), path.join(dir, 'node_modules'), 'dir');
    mkdirSync(path.join(dir, 'examples'));
    const byModule = new Map<string, Example>();
    for (const example of examples) {
      const file = path.join(dir, 'examples', moduleNameOf(example));
      // `export {}` keeps an example without imports a module (top-level await, its own scope);
      // it goes last, so the example's lines keep their numbers.
      writeFileSync(file, `${withResolvedImports(example)}export {};\n`);
      byModule.set(file, example);
    }
    const tsconfig = {
      compilerOptions: { ...compilerOptions, target: 'ES2022', lib: ['ES2023'], module: 'NodeNext', moduleResolution: 'NodeNext' },
      files: [GLOBALS, ...byModule.keys()],
    };
    writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2) + '\n');

    const program = ts.createProgram([GLOBALS, ...byModule.keys()], compilerOptions);
    const diagnostics = ts.getPreEmitDiagnostics(program);
    let failed = 0;
    for (const diagnostic of diagnostics) {
      const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n');
      const example = diagnostic.file && byModule.get(path.resolve(diagnostic.file.fileName));
      if (!diagnostic.file || !example || diagnostic.start === undefined) {
        // Not inside an example (the globals, a library): report it as it is.
        const where = diagnostic.file ? `${diagnostic.file.fileName}: ` : '';
        console.error(`${where}error TS${diagnostic.code}: ${message}`);
        failed++;
        continue;
      }
      const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start);
      const code = diagnostic.file.text.split('\n')[line] ?? '';
      console.error(
        `${example.file}:${example.line + line}:${character + 1} (@example starting at line ${example.line}): error TS${diagnostic.code}: ${message}\n    ${code.trim()}`,
      );
      failed++;
    }
    if (failed > 0) {
      console.error(`check-doc-examples: ${failed} error(s) in the TSDoc examples (${examples.length} examples checked).`);
      if (keep) console.error(`The examples as compiled: ${dir}`);
      return 1;
    }
    const files = new Set(examples.map((example) => example.file)).size;
    console.log(`check-doc-examples: ${examples.length} TSDoc examples in ${files} files type-check (strict).`);
    if (keep) console.log(`The examples as compiled: ${dir}`);
    return 0;
  } finally {
    if (!keep) rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = main();
