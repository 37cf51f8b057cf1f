/**
 * The HTTP ingestion server: other services enqueue jobs over HTTP with Idempotency-Key
 * semantics. Configuration: the environment (see "HTTP API" in the README). SIGTERM/SIGINT:
 * in-flight requests finish, then it exits.
 */
import { loadHttpEnvConfig, runMain, startHttpServerProcess } from '../src/index.js';

await runMain(() => startHttpServerProcess({ config: loadHttpEnvConfig() }));
