/**
 * A nested `vitest run` of some test files, as `npm test -- <files>` would run them, with an
 * environment of the caller's: its exit code, everything it printed, and vitest's JSON report
 * per file. For the tests of the run itself (which files skip, fail or pass, and what it says).
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const VITEST = fileURLToPath(new URL('../../node_modules/vitest/vitest.mjs', import.meta.url));

/** One file of vitest's JSON report, named relative to the repository. */
export interface FileReport {
  readonly name: string;
  readonly status: string;
  readonly message: string;
  readonly assertionResults: ReadonlyArray<{ readonly title: string; readonly status: string }>;
}

export interface NestedRun {
  readonly code: number | null;
  readonly output: string;
  readonly files: readonly FileReport[];
}

/** Runs `files` in a nested vitest with `env`; its JSON report goes to `outputFile`. */
export async function runNestedVitest(files: readonly string[], env: NodeJS.ProcessEnv, outputFile: string): Promise<NestedRun> {
  const child = spawn(process.execPath, [VITEST, 'run', ...files, '--reporter=default', '--reporter=json', `--outputFile=${outputFile}`], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  const report = JSON.parse(readFileSync(outputFile, 'utf8')) as { testResults: FileReport[] };
  return { code, output, files: report.testResults.map((file) => ({ ...file, name: file.name.slice(ROOT.length) })) };
}

/** The report of `name` in a nested run. */
export const fileNamed = (run: NestedRun, name: string): FileReport => run.files.find((file) => file.name === name)!;
