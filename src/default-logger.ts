import { pino, type Level, type Logger } from 'pino';

/** The level of the library's own logger when neither an option nor `LOG_LEVEL` names one. */
export const DEFAULT_LIBRARY_LOG_LEVEL = 'warn';

const LEVELS: ReadonlySet<string> = new Set<Level | 'silent'>(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']);

/**
 * The logger a library object uses when it was given none: pino's JSON lines on stdout at
 * `LOG_LEVEL` when that names a pino level, else at `warn`. A library embedded in someone's
 * program speaks up only when something needs attention; the runnables, which own their
 * process, log at `info` by default (docs/configuration.md, "Start-up and logs").
 */
export function defaultLogger(env: NodeJS.ProcessEnv = process.env): Logger {
  const asked = env.LOG_LEVEL?.trim().toLowerCase();
  if (asked === undefined || asked === '') return pino({ level: DEFAULT_LIBRARY_LOG_LEVEL });
  if (LEVELS.has(asked)) return pino({ level: asked });
  const logger = pino({ level: DEFAULT_LIBRARY_LOG_LEVEL });
  logger.warn(`LOG_LEVEL=${env.LOG_LEVEL} is not a level (fatal, error, warn, info, debug, trace, silent); logging at ${DEFAULT_LIBRARY_LOG_LEVEL}`);
  return logger;
}
