/**
 * Relative Markdown links and the anchors they name, read as GitHub renders them: used by the
 * documentation's own link test and by the check of the packed package's Markdown.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

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
