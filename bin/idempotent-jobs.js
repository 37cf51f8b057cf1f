#!/usr/bin/env node
// The `idempotent-jobs` command. In a source checkout (src/ present and tsx installed) it runs
// the TypeScript sources through tsx, so it never runs a stale build; an installed package has
// only dist/ and runs the compiled CLI.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const source = new URL('../src/cli/main.ts', import.meta.url);
const compiled = new URL('../dist/src/cli/main.js', import.meta.url);

async function tsxAvailable() {
  try {
    await import('tsx/esm/api');
    return true;
  } catch {
    return false;
  }
}

if (existsSync(fileURLToPath(source)) && (await tsxAvailable())) {
  const { register } = await import('tsx/esm/api');
  register();
  await import(source.href);
} else {
  await import(compiled.href);
}
