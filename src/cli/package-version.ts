import { readFileSync } from 'node:fs';

/**
 * The version in the package's own package.json, found from this module's place: two levels up
 * in a checkout (`src/cli/`), three in the package as installed (`dist/src/cli/`).
 */
export function packageVersion(): string {
  for (const up of ['../../package.json', '../../../package.json']) {
    try {
      const manifest = JSON.parse(readFileSync(new URL(up, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (manifest.name === 'idempotent-jobs' && manifest.version) return manifest.version;
    } catch {
      // Not at this level: try the next.
    }
  }
  return 'unknown';
}
