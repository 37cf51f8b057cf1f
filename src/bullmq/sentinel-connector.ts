import { SentinelConnector } from 'ioredis';

/** What this connector reads of ioredis's (private) failover detector. */
interface FailoverDetectorHandle {
  cleanup(): void;
}

/**
 * ioredis's Sentinel connector, whose failover detector is closed with the connection it watches.
 *
 * With `failoverDetector: true` each connection to the master opens one more connection per
 * sentinel, subscribed to `+switch-master`. ioredis 5 closes those on `disconnect()` and when a
 * failover is detected, but not on `quit()` (redis/ioredis#1362), and `quit()` is how BullMQ
 * closes its queues' and workers' connections: every closed queue left a subscription on each
 * sentinel, reconnecting every minute once the sentinels were gone, and a process that closed
 * everything never exited. Here each detector is cleaned up when the connection to the master
 * it was made for closes, whatever closed it; the next connection makes its own, as before.
 */
export class ClosingSentinelConnector extends SentinelConnector {
  override async connect(...args: Parameters<SentinelConnector['connect']>): ReturnType<SentinelConnector['connect']> {
    const stream = await super.connect(...args);
    // ioredis makes the detector when this stream connects, in a listener added before this
    // one: by the time this one runs the new detector is in place (made synchronously).
    const connected = this.options.enableTLSForSentinelMode && this.options.tls ? 'secureConnect' : 'connect';
    stream.once(connected, () => {
      const detector = (this as unknown as { failoverDetector: FailoverDetectorHandle | null }).failoverDetector;
      if (!detector) return;
      if (stream.destroyed) detector.cleanup();
      else stream.once('close', () => detector.cleanup());
    });
    return stream;
  }
}
