// The layer rule of docs/architecture.md, held to the code: dependency-cruiser with the project's
// own rules (.dependency-cruiser.cjs, which `npm run lint` runs too) finds no arrow against the
// layers and no cycle in src/, and does find them in a small tree laid out like src/ with one
// arrow running back up, one cycle and one statement file imported from outside the store.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { cruise, type ICruiseResult, type IViolation } from 'dependency-cruiser';
import extractDepcruiseOptions from 'dependency-cruiser/config-utl/extract-depcruise-options';
import extractTSConfig from 'dependency-cruiser/config-utl/extract-ts-config';
import { afterAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const RULES = path.join(ROOT, '.dependency-cruiser.cjs');

/** The violations dependency-cruiser finds under `baseDir`'s `src/` with the project's rules. */
async function violationsIn(baseDir: string): Promise<{ violations: readonly IViolation[]; modules: number }> {
  const options = await extractDepcruiseOptions(RULES);
  const tsConfigFile = path.join(baseDir, 'tsconfig.json');
  const result = await cruise(['src'], { ...options, baseDir, tsConfig: { fileName: tsConfigFile } }, {}, { tsConfig: extractTSConfig(tsConfigFile) });
  const output = result.output as ICruiseResult;
  return { violations: output.summary.violations, modules: output.modules.length };
}

const described = (violations: readonly IViolation[]) => violations.map((v) => `${v.rule.name}: ${v.from} -> ${v.to}`);

describe('the layers', () => {
  const tree = mkdtempSync(path.join(tmpdir(), 'ij-layers-'));
  afterAll(() => rmSync(tree, { recursive: true, force: true }));

  it('src/ has no import cycle and no arrow against the layers', async () => {
    const { violations, modules } = await violationsIn(ROOT);
    expect(modules).toBeGreaterThan(150);
    expect(described(violations)).toEqual([]);
  });

  it('an arrow that runs back up, a cycle and a statement file read from outside the store are each reported', async () => {
    const file = (relative: string, text: string) => {
      mkdirSync(path.dirname(path.join(tree, relative)), { recursive: true });
      writeFileSync(path.join(tree, relative), text);
    };
    file('tsconfig.json', JSON.stringify({ compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', strict: true }, include: ['src'] }));
    file('src/store/records.ts', 'export interface KeyRecord { readonly key: string }\n');
    file('src/store/sql/get-key.ts', "import type { KeyRecord } from '../records.js';\nexport const getKey = (key: string): KeyRecord => ({ key });\n");
    // The store reaching up to the composition room.
    file('src/store/key-store.ts', "import { startProcess } from '../runtime/process.js';\nexport const open = startProcess;\n");
    file('src/runtime/process.ts', "import type { KeyRecord } from '../store/records.js';\nexport const startProcess = (record?: KeyRecord) => record;\n");
    // Two files of the consumer that import each other.
    file('src/consumer/runner.ts', "import { contextOf } from './context.js';\nexport const run = () => contextOf();\n");
    file('src/consumer/context.ts', "import { run } from './runner.js';\nexport const contextOf = () => run;\n");
    // An operator read going around the store's door.
    file('src/http/inspector.ts', "import { getKey } from '../store/sql/get-key.js';\nexport const show = getKey;\n");

    const { violations } = await violationsIn(tree);
    const cycles = violations.filter((v) => v.rule.name === 'no-circular');
    expect(described(violations.filter((v) => v.rule.name !== 'no-circular')).sort()).toEqual([
      'layer-store: src/store/key-store.ts -> src/runtime/process.ts',
      'sql-stays-in-store: src/http/inspector.ts -> src/store/sql/get-key.ts',
    ]);
    // The cycle is reported once, from whichever of its files the cruise met first.
    expect(cycles).toHaveLength(1);
    expect([cycles[0]!.from, cycles[0]!.to].sort()).toEqual(['src/consumer/context.ts', 'src/consumer/runner.ts']);
  });
});
