/**
 * A set-up file of every test file: under `CI=true`, in a run without Redis (or without a broker),
 * a file marked `@module-tag redis` (or the broker's tag) fails at its start with the line that
 * says why (./redis-files.ts, ./broker-files.ts). Outside CI such a file's tests are skipped by
 * the tag and this hook does not run.
 */
import { beforeAll, inject } from 'vitest';
import { BROKER_TAGS, missingBrokerLine } from './broker-files.js';
import { REDIS_TAG, missingRedisLine } from './redis-files.js';

// eslint-disable-next-line no-empty-pattern -- Vitest reads a hook's fixtures from its first parameter's pattern.
beforeAll(({}, suite) => {
  const redisMissing = inject('redisMissing');
  if (redisMissing !== '' && suite.tags?.includes(REDIS_TAG)) throw new Error(missingRedisLine(redisMissing, suite.file.name));
  const brokersMissing = inject('brokersMissing');
  for (const tag of BROKER_TAGS) {
    if (brokersMissing[tag] !== '' && suite.tags?.includes(tag)) throw new Error(missingBrokerLine(tag, brokersMissing[tag], suite.file.name));
  }
});
