import type { GroupStatements, KeyStore } from '../store/key-store.js';
import type { EffectOptions } from './effect-options.js';
import type { GroupCommitter } from './group-commit.js';
import type { GroupedEffects, ResolvedIdempotencyOptions } from './idempotency-options.js';

/** The committer that groups effects, and the store's statements its jobs end with. */
export interface GroupOfEffects {
  readonly committer: GroupCommitter;
  readonly statements: GroupStatements;
  /** Which effects it groups: every one, or only database-only ones. */
  readonly effects: GroupedEffects;
}

/** What the pieces of the claim protocol share: the resolved options, the store, the group (when group commit is on). */
export interface ProtocolParts {
  readonly options: ResolvedIdempotencyOptions;
  readonly store: KeyStore;
  readonly group: GroupOfEffects | undefined;
}

/** The group an effect joins: any effect when every effect is grouped, else only a database-only one. */
export function groupFor(parts: ProtocolParts, options: EffectOptions): GroupOfEffects | undefined {
  const group = parts.group;
  if (group === undefined || options.runsAlone === true) return undefined;
  return group.effects === 'all' || options.databaseOnly === true ? group : undefined;
}
