/**
 * `npm ci` on a Node the package supports warns about no package (EBADENGINE): every package the
 * lockfile installs here declares support for every Node version that package.json's `engines`
 * allows. (The benchmark's peers, which need Node 22, live in bench/peers with a lockfile of
 * their own.)
 */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import semver from 'semver';
import { expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const manifest = JSON.parse(readFileSync(`${ROOT}package.json`, 'utf8')) as { engines: { node: string } };
const lock = JSON.parse(readFileSync(`${ROOT}package-lock.json`, 'utf8')) as {
  packages: Record<string, { engines?: { node?: string } | string[]; optional?: boolean; link?: boolean }>;
};

it('every package npm ci installs supports every Node that engines allows', () => {
  const ours = manifest.engines.node;
  expect(semver.validRange(ours)).not.toBeNull();
  const refusing: string[] = [];
  for (const [path, entry] of Object.entries(lock.packages)) {
    if (path === '' || entry.link) continue;
    // Optional packages for other platforms are not installed here, and npm skips them silently.
    if (entry.optional && !existsSync(`${ROOT}${path}`)) continue;
    const theirs = Array.isArray(entry.engines) ? undefined : entry.engines?.node;
    if (theirs && !semver.subset(ours, theirs)) refusing.push(`${path.replace(/^.*node_modules\//, '')}: ${theirs}`);
  }
  expect(refusing, `packages whose engines.node leaves out Node versions that "${ours}" allows`).toEqual([]);
});

it("this Node, and the Node 22 and 24 CI runs, are ones engines allows", () => {
  expect(semver.satisfies(process.version, manifest.engines.node)).toBe(true);
  for (const version of ['22.13.0', '24.11.0', '20.19.0']) expect(semver.satisfies(version, manifest.engines.node)).toBe(true);
});
