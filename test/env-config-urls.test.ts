/**
 * DATABASE_URL and DATABASE_DIRECT_URL name Postgres: another database's URL (a `mysql://` one
 * copied from another service) is refused at start, saying Postgres is the only one.
 */
import { expect, it } from 'vitest';
import { loadEnvConfig } from '../src/process/index.js';

it('refuses a mysql:// DATABASE_URL or DATABASE_DIRECT_URL, naming the variable and what it must be', () => {
  expect(() => loadEnvConfig({ DATABASE_URL: 'mysql://root@127.0.0.1:3306/app' })).toThrow(
    /DATABASE_URL: must be a postgres:\/\/ \(or postgresql:\/\/\) URL: the keys are kept in Postgres only/,
  );
  expect(() => loadEnvConfig({ DATABASE_DIRECT_URL: 'mysql://root@127.0.0.1:3306/app' })).toThrow(/DATABASE_DIRECT_URL: must be a postgres:\/\//);
});

it('takes postgres:// and postgresql:// URLs', () => {
  expect(loadEnvConfig({ DATABASE_URL: 'postgresql://app@db:5432/app' }).DATABASE_URL).toBe('postgresql://app@db:5432/app');
  expect(loadEnvConfig({ DATABASE_URL: 'postgres://app@db:5432/app' }).DATABASE_URL).toBe('postgres://app@db:5432/app');
});
