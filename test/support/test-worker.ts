/** Child-process worker for the tests: the runnable worker with the test handler. */
import { loadEnvConfig, startWorkerProcess } from '../../src/process/index.js';
import { testHandler } from './test-handler.js';

const config = loadEnvConfig();
await startWorkerProcess({ config, handler: testHandler(config.SCHEMA, `pid-${process.pid}`) });
