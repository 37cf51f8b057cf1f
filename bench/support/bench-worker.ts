/**
 * A benchmark worker process: the library's runnable worker with the benchmark handler. It
 * prints one JSON line `{"msg":"bench worker ready"}` once it takes jobs, whatever LOG_LEVEL is.
 */
import { loadEnvConfig, startWorkerProcess } from '../../src/process/index.js';
import { benchHandler } from './bench-handler.js';

const config = loadEnvConfig();
await startWorkerProcess({ config, handler: benchHandler(config.SCHEMA, `pid-${process.pid}`) });
process.stdout.write(`${JSON.stringify({ msg: 'bench worker ready', pid: process.pid })}\n`);
