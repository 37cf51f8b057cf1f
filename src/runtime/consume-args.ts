/** What `consume` was given, for every broker. */
export interface ConsumeArgs {
  readonly broker: string;
  readonly handler: string;
  /** Queue (AMQP) or stream/consumer (JetStream). */
  readonly queue?: string;
  readonly url?: string;
  readonly concurrency?: number;
  /** Where the key comes from: `body` (wire contract), `header`, `message-id`. */
  readonly keyFrom?: string;
  /** The scope of keys read from headers. */
  readonly scope?: string;
}
