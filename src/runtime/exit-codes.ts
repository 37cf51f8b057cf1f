/**
 * Exit codes of the `idempotent-jobs` command, stable for scripts:
 *
 * | Code | Meaning |
 * | --- | --- |
 * | 0 | success |
 * | 1 | runtime failure (database unreachable, unexpected error) |
 * | 2 | bad usage or configuration (unknown option, invalid value or environment variable) |
 * | 3 | not found (the key does not exist) |
 * | 4 | refused: the key's state does not allow it (e.g. `keys release` of a completed key) |
 */
export const EXIT_OK = 0;
/** Runtime failure. */
export const EXIT_FAILURE = 1;
/** Bad usage or configuration. */
export const EXIT_USAGE = 2;
/** The key does not exist. */
export const EXIT_NOT_FOUND = 3;
/** The key's state does not allow the operation. */
export const EXIT_CONFLICT = 4;
