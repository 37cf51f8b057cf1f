/**
 * Every relative Markdown link in README.md, docs/*.md and examples/**\/README.md points to a
 * file or directory that exists, and every `#anchor` into a Markdown file (or within one)
 * names one of its headings, slugged as GitHub does: lower case, punctuation dropped except
 * `-` and `_`, each space a `-`, a repeated heading suffixed `-1`, `-2`, …
 */
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { anchorsOf, brokenLinks, githubSlug } from './support/markdown-links.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** README.md, docs/*.md and every README.md under examples/. */
function documentationFiles(): string[] {
  const files = ['README.md'];
  for (const entry of readdirSync(join(ROOT, 'docs'))) if (entry.endsWith('.md')) files.push(`docs/${entry}`);
  const visit = (dir: string) => {
    for (const entry of readdirSync(join(ROOT, dir))) {
      const path = `${dir}/${entry}`;
      if (entry === 'node_modules') continue;
      if (statSync(join(ROOT, path)).isDirectory()) visit(path);
      else if (entry === 'README.md') files.push(path);
    }
  };
  visit('examples');
  return files;
}

describe('relative links in the documentation', () => {
  it('all resolve, anchors included', () => {
    const files = documentationFiles();
    expect(files).toEqual(expect.arrayContaining(['README.md', 'docs/architecture.md', 'docs/configuration.md', 'examples/README.md']));
    expect(brokenLinks(ROOT, files)).toEqual([]);
  });

  it('slugs headings as GitHub does', () => {
    expect(githubSlug('The `idempotent-jobs` command')).toBe('the-idempotent-jobs-command');
    expect(githubSlug('RabbitMQ (`idempotent-jobs/amqp`)')).toBe('rabbitmq-idempotent-jobsamqp');
    expect(githubSlug("A key's life")).toBe('a-keys-life');
    expect(githubSlug('Postgres: sizing the keys table')).toBe('postgres-sizing-the-keys-table');
    expect(githubSlug('Deliveries, attempts and `max_deliver`')).toBe('deliveries-attempts-and-max_deliver');
    expect(githubSlug('Running it — step 1 [see](x.md)')).toBe('running-it--step-1-see');
    expect([...anchorsOf('# A\n## Identity\n```sh\n# not a heading\n```\n## Identity\n<a id="custom"></a>\n')]).toEqual([
      'a',
      'identity',
      'identity-1',
      'custom',
    ]);
  });

  describe('on a broken link', () => {
    const dir = mkdtempSync(join(tmpdir(), 'docs-links-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('fails, naming the file, the line and what is missing', () => {
      writeFileSync(join(dir, 'b.md'), '# B\n\n## Present heading\n');
      writeFileSync(
        join(dir, 'a.md'),
        [
          '# A',
          'Fine: [b](b.md), [b](b.md#present-heading), [self](#a), [web](https://example.com/x.md), `[code](nope.md)`.',
          'Broken: [c](c.md) and [b](b.md#absent-heading) and [self](#nowhere).',
          '```md',
          '[in a fence](also-nope.md)',
          '```',
        ].join('\n'),
      );
      expect(brokenLinks(dir, ['a.md'])).toEqual([
        'a.md:3: c.md: no such file c.md',
        'a.md:3: b.md#absent-heading: no heading #absent-heading in b.md',
        'a.md:3: #nowhere: no heading #nowhere in a.md',
      ]);
    });
  });
});
