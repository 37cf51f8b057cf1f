import type { Command } from 'commander';
import { loadEnvConfig } from '../runtime/env-config.js';
import { withDatabase } from './with-database.js';
import { formatDuration, formatTable, formatTime } from '../text-table.js';

/** `stats`: counts by status, expired leases and keys, the oldest processing key, the outbox backlog. */
export function registerStatsCommand(program: Command): void {
  program
    .command('stats')
    .description('counts of keys by status, expired leases, the oldest processing key and the outbox backlog')
    .option('--json', 'print the statistics as JSON')
    .action(async (options: { json?: boolean }) => {
      const config = loadEnvConfig();
      const stats = await withDatabase((store) => store.keyStats({ sweepAfterMs: config.SWEEP_AFTER_MS }));
      if (options.json) {
        console.log(JSON.stringify({ schema: config.SCHEMA, ...stats }));
        return;
      }
      const oldest = stats.oldestProcessing;
      console.log(`Schema ${config.SCHEMA}\n`);
      console.log(
        formatTable(
          ['STATUS', 'KEYS'],
          [
            ['processing', String(stats.processing)],
            ['completed', String(stats.completed)],
            ['failed', String(stats.failed)],
            ['total', String(stats.processing + stats.completed + stats.failed)],
          ],
        ),
      );
      console.log('');
      console.log(`Expired leases:        ${stats.expiredLeases} (processing keys whose lease ended: a takeover, retry or the sweeper will handle them)`);
      console.log(
        `Past sweep horizon:    ${stats.pastSweepHorizon} (processing keys whose lease ended over ${formatDuration(config.SWEEP_AFTER_MS)} ago, SWEEP_AFTER_MS: jobs not running; see docs/operations.md#keys-stuck-processing)`,
      );
      console.log(`Expired keys:          ${stats.expiredKeys} (finished keys past their retention, waiting for the janitor)`);
      console.log(`Tombstones:            ${stats.tombstones} (keys deleted after their retention whose duplicates are still refused; TOMBSTONE_MS)`);
      console.log(
        `Oldest processing key: ${
          oldest ? `"${oldest.key}" in scope "${oldest.scope}", created ${formatTime(oldest.createdAt)} (${formatDuration(oldest.ageMs)} ago)` : 'none'
        }`,
      );
      console.log(
        `Outbox unsent rows:    ${stats.outboxUnsent}${
          stats.oldestUnsentAgeMs !== null ? ` (oldest ${formatDuration(stats.oldestUnsentAgeMs)} old)` : ''
        }`,
      );
    });
}
