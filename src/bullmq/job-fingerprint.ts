import type { Fingerprinter } from '../fingerprint.js';
import { identityFromWireContract, type JobLike } from '../consumer/wire-contract.js';

/**
 * The fingerprint of a BullMQ job under the wire contract (job name + payload, as the worker's
 * claim computes it), or undefined when its data is not under the contract. Two jobs with the
 * same id are the same request only if their fingerprints are equal: a job id depends on scope
 * and key alone, so after retention the id may hold an earlier request's job.
 */
export function fingerprintOfJob(job: JobLike, fingerprint: Fingerprinter): string | undefined {
  try {
    return fingerprint(identityFromWireContract(job).fingerprintOf);
  } catch {
    return undefined;
  }
}
