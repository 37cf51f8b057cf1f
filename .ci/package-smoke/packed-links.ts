// Run by .ci/package-smoke.sh on the extracted tarball: every relative link in its Markdown
// names a file the package holds, and every anchor a heading of that file.
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { brokenLinks } from '../../test/support/markdown-links.js';

const root = process.argv[2]!;
const files = ['README.md', 'CHANGELOG.md', ...readdirSync(join(root, 'docs')).filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`)];
const broken = brokenLinks(root, files);
if (broken.length > 0) {
  console.error(`links in the packed Markdown that lead nowhere:\n${broken.join('\n')}`);
  process.exit(1);
}
console.log(`packed Markdown: ${files.length} files, every relative link resolves inside the package`);
