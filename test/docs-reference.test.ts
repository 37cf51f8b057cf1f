/**
 * The docs are reference: they say what is true now, not what happened before (no "the run
 * before", "an earlier run", "this machine"), a number quoted in two places is the same number,
 * and the front door's commands and the guide's advice are the ones that work.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const read = (path: string) => readFileSync(new URL(`../${path}`, import.meta.url), 'utf8');
const DOCS = ['README.md', ...readdirSync(new URL('../docs', import.meta.url)).filter((file) => file.endsWith('.md')).map((file) => `docs/${file}`)];

/** Phrases that tell a story of runs instead of stating a result with its command, commit and date. */
const HISTORY = [/the\s+same\s+afternoon/i, /afternoon\s+speed/i, /the\s+run\s+before/i, /an\s+earlier\s+run\s+(?:at|on|gave)\b/i, /\bthis\s+(?:2-core\s+|project's\s+)?machine\b/i, /191–216/];

describe('the docs', () => {
  it.each(DOCS)('%s carries no history, only results with their command, commit and date', (file) => {
    const text = read(file);
    for (const phrase of HISTORY) expect(text, `${file}: ${phrase}`).not.toMatch(phrase);
  });

  it("quote the deployed benchmark's ratio for the leased path where they compare with it, the README included", () => {
    const row = /^\| function handler, defaults \(`leased`\) \| Redis \| \d+ \| ([\d.]+) \(/m.exec(read('docs/benchmarks.md'));
    expect(row).not.toBeNull();
    expect(read('README.md')).toMatch(new RegExp(`a function handler runs at ${row![1]!.replace('.', '\\.')}×`));
    const brokers = read('docs/brokers.md');
    const quoted = /the leased path's ratio to the lean BullMQ baseline: ([\d.]+)/.exec(brokers);
    expect(quoted?.[1]).toBe(row![1]);
  });

  it('operations.md gives one rate for leased claims + completions with 5 connections: the measured one, with its command, commit and date', () => {
    const operations = read('docs/operations.md');
    const rates = [...operations.matchAll(/([\d,]+)(?:–[\d,]+)? (?:leased claims \+ completions per second|keys\/s per 5 connections)/g)].map((m) => m[1]);
    expect(new Set(rates)).toEqual(new Set(['1,807']));
    expect(operations).toMatch(/1,807 leased claims \+ completions per\s+second \(`npm run bench:keys-growth[^`]*`, commit `9774664`,\s+2026-11-30/);
  });
});

describe('the README', () => {
  it('quick start: npm ci once, then the demo and the tests', () => {
    const block = /## Quick start\n\n```sh\n([\s\S]*?)```/.exec(read('README.md'))![1]!;
    expect(block.match(/npm ci/g)).toHaveLength(1);
    expect(block).toMatch(/^npm run demo\b/m);
    expect(block).toMatch(/^npm test\b/m);
  });

  it('says what the whole suite needs, and what a missing program does', () => {
    const readme = read('README.md');
    for (const needed of ['RabbitMQ', 'NATS', 'chromium', 'pgbouncer', 'prometheus', 'npm ci --prefix tools/node-versions', 'CI=true']) expect(readme).toContain(needed);
  });
});

describe('the guide on external steps', () => {
  it('says that a paused owner\'s call may land after the new owner recorded the step, and passes step.signal to the HTTP client', () => {
    const guide = read('docs/guide.md');
    const section = guide.split(/^## Multi-step jobs$/m)[1]!.split(/^## /m)[0]!;
    expect(section).not.toMatch(/runs again only under a new claim, when the last owner died/);
    expect(section).toMatch(/paused past its lease/);
    expect(section).toMatch(/the paused owner's call may still land in the other system after the new owner ran the step and recorded it/);
    const code = /```ts\n([\s\S]*?)```/.exec(section)![1]!;
    expect(code).toMatch(/fetch\([^)]*\{[\s\S]*'idempotency-key': step\.stepKey[\s\S]*signal: step\.signal/);
  });
});
