/**
 * `prisma generate` for the Prisma data layer's tests and example. The Prisma CLI is installed
 * apart, in tools/prisma (see its package.json for why), by `.ci/run`; a fresh clone gets it here
 * on first use, as `npm ci --prefix tools/prisma` would.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PRISMA_CLI = `${ROOT}tools/prisma/node_modules/.bin/prisma`;

/** Writes the client of `schema` (a path from the project's root) where its generator says; no schema engine needed. */
export function prismaGenerate(schema: string): void {
  if (!existsSync(PRISMA_CLI)) execFileSync('npm', ['ci', '--prefix', 'tools/prisma', '--no-audit', '--no-fund'], { cwd: ROOT, stdio: 'ignore' });
  execFileSync(PRISMA_CLI, ['generate', '--schema', schema], {
    cwd: ROOT,
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: '/bin/false', PRISMA_HIDE_UPDATE_MESSAGE: '1' },
  });
}
