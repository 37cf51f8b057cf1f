/**
 * Every relative Markdown link in README.md, docs/*.md and examples/**\/README.md points to a
 * file or directory that exists, and every `#anchor` into a Markdown file (or within one)
 * names one of its headings, slugged as GitHub does: lower case, punctuation dropped except
 * `-` and `_`, each space a `-`, a repeated heading suffixed `-1`, `-2`, …
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** GitHub's anchor for a heading's text (its Markdown: code spans, links and emphasis are read as text). */
export function githubSlug(heading: string): string {
  const text = heading
    .replace(/!\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/<[^>]+>/g, '')
    .replace(/[`*]/g, '');
  return text
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
    .replace(/ /g, '-');
}

/** The lines of `markdown` outside fenced code blocks, with their 1-based numbers. */
function proseLines(markdown: string): Array<{ text: string; number: number }> {
  const lines: Array<{ text: string; number: number }> = [];
  let fence: string | undefined;
  markdown.split('\n').forEach((text, index) => {
    const opening = /^\s{0,3}(`{3,}|~{3,})/.exec(text);
    if (opening) {
      if (fence === undefined) fence = opening[1]![0]!;
      else if (opening[1]![0] === fence) fence = undefined;
      return;
    }
    if (fence === undefined) lines.push({ text, number: index + 1 });
  });
  return lines;
}

/** The anchors `markdown` defines: its headings' slugs (repeats numbered) and explicit `id`/`name` attributes. */
export function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const { text } of proseLines(markdown)) {
    const heading = /^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(text);
    if (heading) {
      const slug = githubSlug(heading[1]!);
      const count = seen.get(slug) ?? 0;
      seen.set(slug, count + 1);
      anchors.add(count === 0 ? slug : `${slug}-${count}`);
    }
    for (const [, id] of text.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) anchors.add(id!);
  }
  return anchors;
}

/** The link targets of `markdown` (inline links, images and reference definitions), outside code. */
export function linksOf(markdown: string): Array<{ target: string; line: number }> {
  const links: Array<{ target: string; line: number }> = [];
  for (const { text, number } of proseLines(markdown)) {
    const prose = text.replace(/(`+)[^`]*?\1/g, (span) => ' '.repeat(span.length));
    for (const [, target] of prose.matchAll(/\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+"[^"]*")?\s*\)/g)) {
      links.push({ target: target!.replace(/^<|>$/g, ''), line: number });
    }
    const definition = /^\s{0,3}\[[^\]]+\]:\s*(\S+)/.exec(prose);
    if (definition) links.push({ target: definition[1]!, line: number });
  }
  return links;
}

/** One line per broken relative link in `files` (paths relative to `root`). */
export function brokenLinks(root: string, files: readonly string[]): string[] {
  const anchorCache = new Map<string, Set<string>>();
  const anchorsIn = (path: string) => {
    let anchors = anchorCache.get(path);
    if (!anchors) anchorCache.set(path, (anchors = anchorsOf(readFileSync(path, 'utf8'))));
    return anchors;
  };
  const broken: string[] = [];
  for (const file of files) {
    const path = join(root, file);
    for (const { target, line } of linksOf(readFileSync(path, 'utf8'))) {
      // Absolute URLs (https:, mailto:, …) are someone else's to keep alive.
      if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('//')) continue;
      const hash = target.indexOf('#');
      const pathPart = decodeURIComponent(hash === -1 ? target : target.slice(0, hash));
      const anchor = hash === -1 ? undefined : decodeURIComponent(target.slice(hash + 1));
      const destination = pathPart === '' ? path : resolve(dirname(path), pathPart);
      const where = `${file}:${line}: ${target}`;
      if (!existsSync(destination)) {
        broken.push(`${where}: no such file ${relative(root, destination)}`);
        continue;
      }
      if (anchor !== undefined && anchor !== '' && destination.endsWith('.md') && statSync(destination).isFile()) {
        if (!anchorsIn(destination).has(anchor)) broken.push(`${where}: no heading #${anchor} in ${relative(root, destination)}`);
      }
    }
  }
  return broken;
}

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
