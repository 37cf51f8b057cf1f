/**
 * The demo's report as text (demo/payment-report.ts): counts read as English ("1 run", "2
 * runs"), and a worker whose pid is unknown is said to be so, not printed as "pid ?".
 */
import { describe, expect, it } from 'vitest';
import { counted, formatPaymentReport, type PaymentReport } from '../demo/payment-report.js';

const report: PaymentReport = {
  steps: [
    { step: 'reserve', kind: 'database', calls: 11, effects: 10, keysWithRepeats: 1 },
    { step: 'charge', kind: 'external', calls: 11, effects: 10, keysWithRepeats: 0 },
    { step: 'ledger', kind: 'database', calls: 12, effects: 10, keysWithRepeats: 2 },
    { step: 'email', kind: 'external', calls: 11, effects: 11, keysWithRepeats: 1 },
    { step: 'completion', kind: 'ctx.transaction', calls: 10, effects: 10, keysWithRepeats: 0 },
  ],
  resumptions: [
    { scope: 'demo', key: 'known', lostFence: 1, lostPid: 4242, fence: 2, pid: 4343, stoppedAt: 'charge', inside: false, resumedAt: 'charge', callsBeforeTakeover: 0 },
    { scope: 'demo', key: 'early', lostFence: 1, lostPid: undefined, fence: 2, pid: 4343, stoppedAt: 'reserve', inside: false, resumedAt: 'reserve', callsBeforeTakeover: 0 },
  ],
  emailRepeats: 1,
  duplicatedKeys: 0,
  problems: [],
};

describe("the demo's report", () => {
  it('counts in the singular for one and the plural otherwise', () => {
    expect([counted(0, 'run'), counted(1, 'run'), counted(2, 'run')]).toEqual(['0 runs', '1 run', '2 runs']);
    const text = formatPaymentReport(report, 4242);
    expect(text).toMatch(/reserve +database +11 +10 {2}1 run rolled back, 1 key twice$/m);
    expect(text).toMatch(/charge +external +11 +10 {2}1 repeated call, deduplicated by the provider/m);
    expect(text).toMatch(/ledger +database +12 +10 {2}2 runs rolled back, 2 keys twice$/m);
    expect(text).toMatch(/email +external +11 +11 {2}1 e-mail sent twice/m);
    expect(text).toMatch(/completion +ctx\.transaction +10 +10 {2}0 keys twice$/m);
    expect(text).not.toMatch(/\b1 (runs|keys|e-mails|repeated calls)\b/);
  });

  it('names each worker by its pid, and says so where it is unknown instead of "pid ?"', () => {
    const text = formatPaymentReport(report, 4242);
    expect(text).toContain('stopped before charge (fence 1, pid 4242) → resumed at charge (fence 2, pid 4343)');
    expect(text).toContain('stopped before reserve (fence 1, pid unknown: killed before its first write) → resumed at reserve (fence 2, pid 4343)');
    expect(text).not.toContain('pid ?');
  });
});
