import type { TestProject } from 'vitest/node';
import { resolveServiceUrls } from './service-urls.js';

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    redisUrl: string;
  }
}

/** Resolves Postgres and Redis once for the whole run and hands the URLs to every test file. */
export default async function setup(project: TestProject) {
  const urls = await resolveServiceUrls();
  console.log(`[tests] Node ${process.version}; Postgres and Redis from ${urls.source}: ${urls.databaseUrl} ${urls.redisUrl}`);
  project.provide('databaseUrl', urls.databaseUrl);
  project.provide('redisUrl', urls.redisUrl);
  return async () => {
    await urls.stop?.();
  };
}
