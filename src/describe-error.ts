/**
 * An error's message for a log line or another message: each of an AggregateError's messages
 * (a host name that resolved to several addresses, each refused), else its message, code or name.
 */
export function describeError(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) return error.errors.map(describeError).join('; ');
  return error instanceof Error ? error.message || (error as NodeJS.ErrnoException).code || error.name : String(error);
}
