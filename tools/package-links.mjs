#!/usr/bin/env node
// The Markdown the package ships (README.md, CHANGELOG.md, docs/*.md) links to files of the
// repository that are not in the package (examples/, bench/results/, deploy/, …). In the
// repository those relative links resolve; in node_modules and on the registry's page they
// would lead nowhere. `prepack` runs `rewrite`: each such link becomes an absolute link into the
// repository on GitHub (anchors kept), with the originals saved aside; `postpack` runs `restore`.
// Links between shipped files stay relative.
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SAVED = join(ROOT, '.package-links-originals');
const REPOSITORY = 'https://github.com/idempotent-jobs/idempotent-jobs';

/** The Markdown files the package ships, relative to the root. */
export function shippedMarkdown(root = ROOT) {
  const docs = readdirSync(join(root, 'docs')).filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`);
  return ['README.md', 'CHANGELOG.md', ...docs].filter((file) => existsSync(join(root, file)));
}

/** Whether the repository path `path` (relative to the root) is in the package (package.json `files`). */
export function isShipped(path) {
  return /^(README\.md|CHANGELOG\.md|LICENSE|package\.json)$/.test(path) || /^docs\/([^/]+\.md|images(\/.*)?)$/.test(path) || /^(dist|bin)(\/|$)/.test(path);
}

/**
 * `markdown` (the text of `file`, relative to `root`) with every relative link to a path outside
 * the package made absolute into the repository; links in code spans and fences are left alone.
 */
export function withPackageLinks(markdown, file, root = ROOT) {
  let fence;
  return markdown
    .split('\n')
    .map((line) => {
      const opening = /^\s{0,3}(`{3,}|~{3,})/.exec(line);
      if (opening) {
        if (fence === undefined) fence = opening[1][0];
        else if (opening[1][0] === fence) fence = undefined;
        return line;
      }
      if (fence !== undefined) return line;
      // Code spans are kept as they are: split them out, rewrite the rest.
      return line
        .split(/((`+)[^`]*?\2)/)
        .map((part, index) => (index % 3 === 0 ? rewriteLinks(part, file, root) : part))
        .filter((_, index) => index % 3 !== 2)
        .join('');
    })
    .join('\n');
}

function rewriteLinks(prose, file, root) {
  const absolute = (target) => {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('//') || target.startsWith('#')) return target;
    const hash = target.indexOf('#');
    const pathPart = hash === -1 ? target : target.slice(0, hash);
    const path = relative(root, resolve(root, dirname(file), decodeURIComponent(pathPart))).split('\\').join('/');
    if (isShipped(path)) return target;
    const kind = existsSync(join(root, path)) && statSync(join(root, path)).isDirectory() ? 'tree' : 'blob';
    return `${REPOSITORY}/${kind}/main/${path}${hash === -1 ? '' : target.slice(hash)}`;
  };
  return prose
    .replace(/(\]\(\s*)(<[^>]*>|[^)\s]+)/g, (_, open, target) =>
      target.startsWith('<') ? `${open}<${absolute(target.slice(1, -1))}>` : `${open}${absolute(target)}`,
    )
    .replace(/^(\s{0,3}\[[^\]]+\]:\s*)(\S+)/, (_, open, target) => `${open}${absolute(target)}`);
}

function rewrite() {
  if (existsSync(SAVED)) restore();
  mkdirSync(SAVED, { recursive: true });
  for (const file of shippedMarkdown()) {
    const path = join(ROOT, file);
    const original = readFileSync(path, 'utf8');
    const rewritten = withPackageLinks(original, file);
    if (rewritten === original) continue;
    mkdirSync(dirname(join(SAVED, file)), { recursive: true });
    copyFileSync(path, join(SAVED, file));
    writeFileSync(path, rewritten);
  }
}

function restore() {
  if (!existsSync(SAVED)) return;
  const visit = (dir) => {
    for (const name of readdirSync(join(SAVED, dir))) {
      const file = dir ? `${dir}/${name}` : name;
      if (statSync(join(SAVED, file)).isDirectory()) visit(file);
      else renameSync(join(SAVED, file), join(ROOT, file));
    }
  };
  visit('');
  rmSync(SAVED, { recursive: true, force: true });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const command = process.argv[2];
  if (command === 'rewrite') rewrite();
  else if (command === 'restore') restore();
  else {
    console.error('usage: node tools/package-links.mjs rewrite|restore');
    process.exit(2);
  }
}
