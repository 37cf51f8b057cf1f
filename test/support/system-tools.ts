/**
 * The programs some test files need besides Node, Postgres, Redis, RabbitMQ, NATS and the
 * project's npm packages: where each is found, the command that installs it, and what a test
 * file does without it. Outside
 * CI a file whose program is missing skips the tests that need it, and the run's set-up prints
 * one line per missing program saying what is missing and the command that installs it; with
 * `CI=true` (as `.ci/run` sets) a missing program fails the file instead, so that CI never
 * passes by skipping.
 */
import { execFileSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** One program a test file runs. */
export interface SystemTool {
  /** How the messages name it. */
  readonly title: string;
  /** The variable that points at another binary; when set, only that path is tried. */
  readonly variable: string;
  /** Reads that variable (spelled out, so that the configuration doc's check sees it read). */
  readonly chosen: (env: NodeJS.ProcessEnv) => string | undefined;
  /** Where to look, in order: absolute paths, or command names looked up on PATH. */
  readonly candidates: readonly string[];
  /** The command that installs it: Debian's or Ubuntu's package, as root; or the project's npm packages. */
  readonly install: string;
  /** The test files (and, after a colon, the tests) that need it. */
  readonly neededBy: string;
}

export const SYSTEM_TOOLS = {
  chromium: {
    title: 'Chromium',
    variable: 'CHROMIUM_PATH',
    chosen: (env) => env.CHROMIUM_PATH,
    candidates: ['/usr/bin/chromium', 'chromium'],
    install: 'apt-get install chromium',
    neededBy: 'test/key-inspector-browser.test.ts',
  },
  pgbouncer: {
    title: 'PgBouncer',
    variable: 'PGBOUNCER',
    chosen: (env) => env.PGBOUNCER,
    candidates: ['pgbouncer', '/usr/sbin/pgbouncer'],
    install: 'apt-get install pgbouncer',
    neededBy: 'test/pgbouncer.test.ts',
  },
  promtool: {
    title: 'promtool',
    variable: 'PROMTOOL',
    chosen: (env) => env.PROMTOOL,
    candidates: ['promtool', '/usr/bin/promtool'],
    install: 'apt-get install --no-install-recommends prometheus',
    neededBy: 'test/dashboard-alerts.test.ts: the promtool checks',
  },
  python3: {
    title: 'Python 3',
    variable: 'PYTHON3',
    chosen: (env) => env.PYTHON3,
    candidates: ['python3'],
    install: 'apt-get install python3',
    neededBy: 'test/foreign-job-ids.test.ts, test/examples.test.ts: the Python producer',
  },
  curl: {
    title: 'curl',
    variable: 'CURL',
    chosen: (env) => env.CURL,
    candidates: ['curl'],
    install: 'apt-get install curl',
    neededBy: 'test/http-api.test.ts: the documented curl examples, test/examples.test.ts: the Python producer',
  },
  patroni: {
    title: 'Patroni',
    variable: 'PATRONI',
    chosen: (env) => env.PATRONI,
    candidates: ['patroni', '/usr/bin/patroni'],
    install: 'apt-get install --no-install-recommends patroni',
    neededBy: 'test/patroni-cluster.test.ts, test/patroni-async.test.ts, test/read-only-store.test.ts',
  },
  etcd: {
    title: 'etcd',
    variable: 'ETCD',
    chosen: (env) => env.ETCD,
    candidates: ['etcd', '/usr/bin/etcd'],
    install: 'apt-get install etcd-server',
    neededBy: 'test/patroni-cluster.test.ts, test/patroni-async.test.ts, test/read-only-store.test.ts',
  },
  haproxy: {
    title: 'HAProxy',
    variable: 'HAPROXY',
    chosen: (env) => env.HAPROXY,
    candidates: ['haproxy', '/usr/sbin/haproxy'],
    install: 'apt-get install haproxy',
    neededBy: 'test/patroni-cluster.test.ts, test/patroni-async.test.ts, test/read-only-store.test.ts',
  },
  mkfsExt4: {
    title: 'mkfs.ext4',
    variable: 'MKFS_EXT4',
    chosen: (env) => env.MKFS_EXT4,
    candidates: ['mkfs.ext4', '/usr/sbin/mkfs.ext4', '/sbin/mkfs.ext4'],
    install: 'apt-get install e2fsprogs',
    neededBy: 'test/small-disk.test.ts, test/full-disk.test.ts',
  },
  node22: {
    title: 'Node 22',
    variable: 'NODE22',
    chosen: (env) => env.NODE22,
    candidates: [fileURLToPath(new URL('../../tools/node-versions/node_modules/node22/bin/node', import.meta.url))],
    install: 'npm ci --prefix tools/node-versions',
    neededBy: 'test/package.test.ts: CommonJS consumers on Node 22',
  },
  node24: {
    title: 'Node 24',
    variable: 'NODE24',
    chosen: (env) => env.NODE24,
    candidates: [fileURLToPath(new URL('../../tools/node-versions/node_modules/node24/bin/node', import.meta.url))],
    install: 'npm ci --prefix tools/node-versions',
    neededBy: 'test/package.test.ts: CommonJS consumers on Node 24',
  },
} as const satisfies Record<string, SystemTool>;

export type SystemToolName = keyof typeof SYSTEM_TOOLS;

/** Whether this run is CI's: `CI` set to true (or 1, yes), as `.ci/run` and most CI services set it. */
export function inCi(env: NodeJS.ProcessEnv = process.env): boolean {
  return /^(1|true|yes)$/i.test(env.CI ?? '');
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function onPath(command: string, env: NodeJS.ProcessEnv): string | undefined {
  try {
    return execFileSync('sh', ['-c', 'command -v "$1"', 'sh', command], { encoding: 'utf8', env }).trim() || undefined;
  } catch {
    return undefined;
  }
}

/** The program's path: the variable's, when set (and only that); else the first candidate found. Undefined when missing. */
export function findSystemTool(name: SystemToolName, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const tool: SystemTool = SYSTEM_TOOLS[name];
  const chosen = tool.chosen(env);
  if (chosen) return executable(chosen) ? chosen : undefined;
  for (const candidate of tool.candidates) {
    const found = candidate.startsWith('/') ? (executable(candidate) ? candidate : undefined) : onPath(candidate, env);
    if (found) return found;
  }
  return undefined;
}

/** The one line that says a program is missing, what needs it, and how to install it. */
export function missingToolLine(name: SystemToolName, env: NodeJS.ProcessEnv = process.env): string {
  const tool: SystemTool = SYSTEM_TOOLS[name];
  const chosen = tool.chosen(env);
  const looked = chosen ? `${tool.variable}=${chosen} is not an executable` : `not found (${tool.candidates.join(', ')})`;
  const outcome = inCi(env) ? 'fails under CI=true' : 'skipped';
  return `${tool.neededBy} ${outcome}: ${tool.title} ${looked}; install it with \`${tool.install}\`, or set ${tool.variable} to its path.`;
}

/**
 * For a test file: the program's path, or undefined when it is missing and this is not CI (the
 * file then skips what needs it; the run's set-up has said so in one line). Under CI=true a
 * missing program throws, failing the file with that line.
 */
export function systemToolForTests(name: SystemToolName): string | undefined {
  const found = findSystemTool(name);
  if (found === undefined && inCi()) throw new Error(missingToolLine(name));
  return found;
}

/** The environment for a child process whose scripts call the program by name: its directory first on PATH. */
export function withToolOnPath(path: string, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const dir = path.slice(0, path.lastIndexOf('/'));
  return { ...env, PATH: `${dir}:${env.PATH ?? ''}` };
}
