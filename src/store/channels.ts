/**
 * LISTEN/NOTIFY channel names. They carry the schema so that several deployments (or test
 * files) sharing one database never wake each other.
 */

/** Notified, at commit, with `{"scope","key"}` whenever a key becomes completed or failed. */
export const keySettledChannel = (schema: string) => `${schema}_key_settled`;
