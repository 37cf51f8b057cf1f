import type { JetStreamClient, JsMsg } from '@nats-io/jetstream';
import { headers } from '@nats-io/transport-node';

/** Header of a dead-lettered message: why it will never run (`invalid-message`, `key-reused`, `failed`, `replayed-failure`). */
export const DEAD_LETTER_REASON_HEADER = 'Idempotent-Jobs-Reason';
/** Header of a dead-lettered message: what was wrong, for a person (one line, at most 1,024 characters). */
export const DEAD_LETTER_ERROR_HEADER = 'Idempotent-Jobs-Error';
/** Header of a dead-lettered message: the stream the original message was in. */
export const DEAD_LETTER_STREAM_HEADER = 'Idempotent-Jobs-Stream';
/** Header of a dead-lettered message: the original message's stream sequence. */
export const DEAD_LETTER_SEQUENCE_HEADER = 'Idempotent-Jobs-Stream-Seq';
/** Header of a dead-lettered message: the subject the original message was published to. */
export const DEAD_LETTER_SUBJECT_HEADER = 'Idempotent-Jobs-Subject';

/** The reasons a message is dead-lettered. */
export type DeadLetterReason = 'invalid-message' | 'key-reused' | 'failed' | 'replayed-failure';

/**
 * Publishes a copy of `message` (its body and headers) to `subject` with the reason headers,
 * and waits for JetStream to store it. Its `Nats-Msg-Id` is the original's stream and sequence,
 * so the copy made again after a crash between this publish and the `term` falls in JetStream's
 * dedup window and is stored once. Throws when no stream took it: the caller then redelivers
 * the message rather than terminate it unrecorded.
 */
export async function publishDeadLetter(js: JetStreamClient, subject: string, message: JsMsg, reason: DeadLetterReason, detail: string): Promise<void> {
  const copy = headers();
  for (const [name, values] of message.headers ?? []) {
    // JetStream's own headers of the original (its dedup id among them) must not steer the copy.
    if (name.toLowerCase().startsWith('nats-')) continue;
    for (const value of values) copy.append(name, value);
  }
  const original = message.headers?.get('Nats-Msg-Id');
  if (original) copy.set('Idempotent-Jobs-Original-Msg-Id', original);
  copy.set(DEAD_LETTER_REASON_HEADER, reason);
  copy.set(DEAD_LETTER_ERROR_HEADER, oneLine(detail));
  copy.set(DEAD_LETTER_STREAM_HEADER, message.info.stream);
  copy.set(DEAD_LETTER_SEQUENCE_HEADER, String(message.seq));
  copy.set(DEAD_LETTER_SUBJECT_HEADER, message.subject);
  await js.publish(subject, message.data, { headers: copy, msgID: `dead-letter:${message.info.stream}:${message.seq}` });
}

function oneLine(text: string): string {
  const flat = text.replace(/[\r\n]+/g, ' ');
  return flat.length > 1024 ? `${flat.slice(0, 1021)}...` : flat;
}
