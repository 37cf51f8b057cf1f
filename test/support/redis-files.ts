/**
 * The test files that need Redis. Each is marked with a `// @module-tag redis` line, a file tag
 * that vitest.config.ts defines. When the run has no Redis (no REDIS_URL, no testcontainers, and
 * nothing answering at the local default; see ./service-urls.ts), outside CI their tests are
 * skipped and the set-up says so in one line; with `CI=true` they run and each fails at its
 * start with that line (./redis-guard.ts), so that CI never passes by skipping. A file that uses
 * Redis without the mark fails in such a run, saying to add it (./test-env.ts).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { inCi } from './system-tools.js';

/** The tag's name, in vitest.config.ts and in the files' marks. */
export const REDIS_TAG = 'redis';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
// Vitest's own pattern for a file's tags (a `//` or docblock `*` line).
const MARK = /(?:\/\/|\*)\s*@module-tag\s+redis\b/;

/** The test files under test/ marked as needing Redis, relative to the repository. */
export function redisFiles(): string[] {
  const files: string[] = [];
  const visit = (dir: string) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) visit(path);
      else if (entry.name.endsWith('.test.ts') && MARK.test(readFileSync(path, 'utf8'))) files.push(relative(ROOT, path));
    }
  };
  visit(join(ROOT, 'test'));
  return files.sort();
}

/**
 * The one line that says which files need Redis and are skipped (or, under CI, fail), why, and
 * what to do. `file`: one file's name, for its own failure; else the line is about them all.
 */
export function missingRedisLine(problem: string, file?: string, env: NodeJS.ProcessEnv = process.env): string {
  const which = file ?? `the ${redisFiles().length} test files marked \`@module-tag redis\``;
  const outcome = inCi(env) ? (file ? 'fails under CI=true' : 'fail under CI=true') : 'skipped';
  return (
    `${which} ${outcome}: ${problem}; ` +
    'start Redis there (`apt-get install redis-server`), or set REDIS_URL to one that answers.'
  );
}
