import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

/** The package's entry points (package.json "exports"), by the specifier users import. */
const entryPoints: Record<string, string> = {
  'idempotent-jobs': './src/index.ts',
  'idempotent-jobs/amqp': './src/amqp/index.ts',
  'idempotent-jobs/nats': './src/nats/index.ts',
  'idempotent-jobs/otel': './src/otel/index.ts',
};

export default defineConfig({
  // The examples import the library as its users do; inside the repository that is its source.
  // Each specifier matches exactly: a plain string alias would also rewrite 'idempotent-jobs/amqp'
  // as a path under the root's file.
  resolve: {
    alias: Object.entries(entryPoints).map(([specifier, file]) => ({
      find: new RegExp(`^${specifier}$`),
      replacement: fileURLToPath(new URL(file, import.meta.url)),
    })),
  },
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
