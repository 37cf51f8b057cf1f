/**
 * Producers in other languages compute the BullMQ job id themselves (`jobIdFor`), so BullMQ's
 * refusal of a second job with the same id protects them too. Each language's id function in
 * examples/ must agree with `jobIdFor` on every valid key, non-ASCII ones above all.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { jobIdFor } from '../src/index.js';
import { assertValidKeyPart } from '../src/protocol/validate.js';
import { systemToolForTests } from './support/system-tools.js';

const PYTHON3 = systemToolForTests('python3');
const PYTHON_JOB_ID = fileURLToPath(new URL('../examples/python-producer/job_id.py', import.meta.url));

/** Runs the Python id function over the pairs in one process; one id per pair. */
function pythonJobIds(pairs: ReadonlyArray<readonly [string, string]>): string[] {
  const run = spawnSync(PYTHON3!, [PYTHON_JOB_ID], {
    input: pairs.map((pair) => JSON.stringify(pair)).join('\n') + '\n',
    encoding: 'utf8',
  });
  if (run.status !== 0) throw new Error(`python3 job_id.py failed: ${run.stderr}`);
  return run.stdout.trimEnd().split('\n');
}

function isValidKeyPart(value: string): boolean {
  try {
    assertValidKeyPart('key', value);
    return true;
  } catch {
    return false;
  }
}

const keyPart = fc.string({ unit: 'binary', minLength: 1, maxLength: 40 }).filter(isValidKeyPart);

describe.skipIf(PYTHON3 === undefined)('the Python producer example computes the job id jobIdFor does', () => {
  it('for the keys the example README names: non-ASCII, quotes, backslashes, control characters, emoji', () => {
    const pairs = [
      ['acme', 'bestellung-ü-42'],
      ['acme', 'order-42'],
      ['täst', '注文-42'],
      ['default', 'quote"back\\slash'],
      ['default', 'tab\tnew\nline\u0001\u007f'],
      ['default', 'emoji-😀-\u2028'],
    ] as const;
    expect(pythonJobIds(pairs)).toEqual(pairs.map(([scope, key]) => jobIdFor(scope, key)));
    expect(jobIdFor('acme', 'bestellung-ü-42')).toMatch(/^ij_cb6365fe/);
  });

  it('for any valid scope and key (property)', () => {
    const pairs = fc.sample(fc.tuple(keyPart, keyPart), { numRuns: 500, seed: 20261130 });
    expect(pythonJobIds(pairs)).toEqual(pairs.map(([scope, key]) => jobIdFor(scope, key)));
  });
});
