/** The idempotency key of one generation of a coalescing key: what each run's effect is fenced by. */
export function generationKey(key: string, generation: number): string {
  return `${key}#${generation}`;
}
