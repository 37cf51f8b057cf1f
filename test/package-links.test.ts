/**
 * Every link a user meets from the installed package resolves: the shipped Markdown (README,
 * CHANGELOG, docs/*.md) as `prepack` rewrites it links only to files the package holds (the
 * rest point into the repository), with the anchors those files have; and each "see
 * docs/…" hint in an error or the command's output names a shipped file and a heading in it.
 * (.ci/package-smoke.sh checks the same on the real tarball.)
 */
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
// @ts-expect-error -- a plain JavaScript tool (run by npm's prepack), without declarations
import { isShipped, shippedMarkdown, withPackageLinks } from '../tools/package-links.mjs';
import { anchorsOf, brokenLinks, githubSlug } from './support/markdown-links.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const shipped = shippedMarkdown(ROOT) as string[];
const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as Record<string, unknown>;

describe('the package manifest', () => {
  it('names the repository, its page and where to report bugs, and ships docs/', () => {
    expect(manifest.repository).toEqual({ type: 'git', url: 'git+https://github.com/idempotent-jobs/idempotent-jobs.git' });
    expect(manifest.homepage).toBe('https://github.com/idempotent-jobs/idempotent-jobs#readme');
    expect(manifest.bugs).toEqual({ url: 'https://github.com/idempotent-jobs/idempotent-jobs/issues' });
    expect(manifest.files).toEqual(expect.arrayContaining(['docs/*.md', 'docs/images']));
    expect(shipped).toEqual(expect.arrayContaining(['README.md', 'CHANGELOG.md', 'docs/guide.md', 'docs/operations.md']));
  });
});

describe('links in the shipped Markdown, as packed', () => {
  const dir = mkdtempSync(join(tmpdir(), 'package-links-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('resolve inside the package, anchors included', () => {
    for (const file of shipped) {
      mkdirSync(dirname(join(dir, file)), { recursive: true });
      writeFileSync(join(dir, file), withPackageLinks(readFileSync(join(ROOT, file), 'utf8'), file, ROOT));
    }
    cpSync(join(ROOT, 'docs/images'), join(dir, 'docs/images'), { recursive: true });
    writeFileSync(join(dir, 'LICENSE'), '');
    expect(brokenLinks(dir, shipped)).toEqual([]);
  });

  it('point into the repository when the file is not shipped, and stay relative when it is', () => {
    const text = withPackageLinks(
      ['See [examples](../examples/README.md#run), [the guide](guide.md#schedules), [a result](../bench/results/x.txt).', '`[code](../examples/x.md)`', '[def]: ../deploy/'].join('\n'),
      'docs/operations.md',
      ROOT,
    ) as string;
    expect(text).toBe(
      [
        'See [examples](https://github.com/idempotent-jobs/idempotent-jobs/blob/main/examples/README.md#run), [the guide](guide.md#schedules), [a result](https://github.com/idempotent-jobs/idempotent-jobs/blob/main/bench/results/x.txt).',
        '`[code](../examples/x.md)`',
        '[def]: https://github.com/idempotent-jobs/idempotent-jobs/tree/main/deploy',
      ].join('\n'),
    );
    expect(isShipped('docs/images/key-inspector.png')).toBe(true);
    expect(isShipped('docs/api/index.html')).toBe(false);
  });
});

/** Every TypeScript file under src/. */
function sourceFiles(dir = join(ROOT, 'src')): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : name.endsWith('.ts') ? [path] : [];
  });
}

/** The docs hints in the source: `docs/x.md#anchor`, `"Heading" in docs/x.md`, `docs/x.md ("Heading")`, `docs/x.md, "Heading"`. */
function hints(): Array<{ where: string; file: string; anchor?: string }> {
  const found: Array<{ where: string; file: string; anchor?: string }> = [];
  for (const path of sourceFiles()) {
    const text = readFileSync(path, 'utf8');
    const where = path.slice(ROOT.length);
    for (const [, file, anchor] of text.matchAll(/\bdocs\/([\w-]+\.md)(?:#([\w-]+))?/g)) found.push({ where, file: `docs/${file!}`, ...(anchor ? { anchor } : {}) });
    for (const [, heading, file] of text.matchAll(/"([^"]+)" in docs\/([\w-]+\.md)/g)) found.push({ where, file: `docs/${file!}`, anchor: githubSlug(heading!) });
    for (const [, file, heading] of text.matchAll(/docs\/([\w-]+\.md),? \(?"([^"]+)"\)?/g)) found.push({ where, file: `docs/${file!}`, anchor: githubSlug(heading!) });
  }
  return found;
}

describe('"see docs/…" hints in errors and the command', () => {
  it('name a shipped file and a heading it has', () => {
    const all = hints();
    expect(all.length).toBeGreaterThan(5);
    const broken = all.filter(({ file, anchor }) => {
      if (!shipped.includes(file)) return true;
      return anchor !== undefined && !anchorsOf(readFileSync(join(ROOT, file), 'utf8')).has(anchor);
    });
    expect(broken.map(({ where, file, anchor }) => `${where}: ${file}${anchor ? `#${anchor}` : ''}`)).toEqual([]);
  });
});
