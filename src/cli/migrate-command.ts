import type { Command } from 'commander';
import { directDatabaseUrl, loadEnvConfig } from '../runtime/env-config.js';
import { explainDatabaseError } from '../runtime/database-problems.js';
import { createPostgresDb } from '../store/create-postgres-db.js';
import { migrateSchema } from '../store/migrate.js';

/**
 * `migrate`: creates or upgrades the tables in $SCHEMA, over $DATABASE_DIRECT_URL when set (the
 * migrations' advisory lock needs a session), else $DATABASE_URL. A new keys table is hash-partitioned
 * when $KEYS_PARTITIONS is set (see {@link migrate}).
 */
export function registerMigrateCommand(program: Command): void {
  program
    .command('migrate')
    .description('create or upgrade the idempotency tables (safe to run from many processes at once)')
    .option('--json', 'print the result as JSON')
    .action(async (options: { json?: boolean }) => {
      const config = loadEnvConfig();
      const url = directDatabaseUrl(config);
      const db = createPostgresDb({ connectionString: url, maxConnections: 1 });
      try {
        const { results = [] } = await migrateSchema(db, { schema: config.SCHEMA, keysPartitions: config.KEYS_PARTITIONS }).catch((error: unknown) => {
          throw explainDatabaseError(error, { variable: url === config.DATABASE_URL ? 'DATABASE_URL' : 'DATABASE_DIRECT_URL', url, schema: config.SCHEMA });
        });
        const applied = results.filter((r) => r.status === 'Success').map((r) => r.migrationName);
        if (options.json) console.log(JSON.stringify({ schema: config.SCHEMA, applied }));
        else console.log(applied.length ? `Applied to schema ${config.SCHEMA}: ${applied.join(', ')}` : `Schema ${config.SCHEMA} is up to date.`);
      } finally {
        await db.destroy();
      }
    });
}
