import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  // The examples import the library as its users do; inside the repository that is its source.
  resolve: { alias: { 'idempotent-jobs': fileURLToPath(new URL('./src/index.ts', import.meta.url)) } },
  test: {
    include: ['test/**/*.test.ts'],
    exclude: ['test/chaos/**', 'node_modules/**'],
    globalSetup: ['test/support/global-setup.ts'],
    pool: 'forks',
    // Two cores here; files run in pairs. Each file has its own schema and Redis prefix.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
