import { Writable } from 'node:stream';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { JobLogger } from '../src/consumer/job-logger.js';

/** A pino logger writing into an array of parsed lines, and a count of the children made of it. */
function capture(level: string) {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk, _encoding, done) {
      lines.push(JSON.parse(String(chunk)));
      done();
    },
  });
  const parent = pino({ level }, stream);
  const made = { children: 0 };
  const child = parent.child.bind(parent);
  parent.child = ((...args: Parameters<typeof child>) => {
    made.children++;
    return child(...args);
  }) as typeof parent.child;
  return { parent, lines, made };
}

describe('JobLogger', () => {
  it('at info, writes each line with the job fields, and the fence once bound', () => {
    const { parent, lines, made } = capture('info');
    const log = new JobLogger(parent, { jobId: 'j1', scope: 's', key: 'k' });
    log.info({ outcome: 'claimed' }, 'key claimed');
    const fenced = log.with({ fence: 3 });
    fenced.info({ outcome: 'completed' }, 'effect committed');
    fenced.warn({ outcome: 'fenced' }, 'completion fenced');
    expect(lines.map(({ msg, jobId, scope, key, fence, outcome }) => ({ msg, jobId, scope, key, fence, outcome }))).toEqual([
      { msg: 'key claimed', jobId: 'j1', scope: 's', key: 'k', fence: undefined, outcome: 'claimed' },
      { msg: 'effect committed', jobId: 'j1', scope: 's', key: 'k', fence: 3, outcome: 'completed' },
      { msg: 'completion fenced', jobId: 'j1', scope: 's', key: 'k', fence: 3, outcome: 'fenced' },
    ]);
    // One child per logger that wrote, however many lines it wrote.
    expect(made.children).toBe(2);
  });

  it('at warn, a job that logs only info lines makes no child logger and writes nothing', () => {
    const { parent, lines, made } = capture('warn');
    const log = new JobLogger(parent, { jobId: 'j2', scope: 's', key: 'k' });
    log.info({ outcome: 'claimed' }, 'key claimed');
    log.with({ fence: 1 }).info({ outcome: 'completed' }, 'effect committed');
    expect(lines).toEqual([]);
    expect(made.children).toBe(0);

    log.warn({ outcome: 'key-reused' }, 'key reused');
    expect(lines).toMatchObject([{ msg: 'key reused', jobId: 'j2', scope: 's', key: 'k', outcome: 'key-reused', level: 40 }]);
    expect(made.children).toBe(1);
  });
});
