/**
 * The store sends JSON as text (`$5::jsonb` with a string). postgres.js types each parameter as
 * the server describes it and would encode that string as JSON once more (a jsonb string, not
 * the object): a parameter cast to json or jsonb goes through text first.
 */
export function jsonAsText(text: string): string {
  return text.replace(/(\$\d+)::(jsonb?)\b/g, '$1::text::$2');
}

/** A statement in Knex's raw form: `?` for each value, in order. */
export interface PositionalStatement {
  readonly text: string;
  readonly values: unknown[];
}

/**
 * A statement with `$1`, `$2`, … placeholders in Knex's raw form (`knex.raw(text, values)`):
 * each placeholder a `?`, its value in `values` at that position (a placeholder used twice, or
 * out of order, takes its value twice or out of order), and each `?` of the text itself (a jsonb
 * operator) escaped as `\?`, which Knex sends as a plain `?`. Knex cannot send a backslash right
 * before a `?` (its escape), so a text with one before a `?` or a placeholder is refused rather
 * than sent altered; the store's statements have none.
 */
export function questionMarkPlaceholders(text: string, parameters: readonly unknown[]): PositionalStatement {
  if (/\\(\?|\$\d)/.test(text)) {
    throw new Error(`Knex cannot send this statement unchanged: a backslash right before "?" or a $n placeholder is Knex's escape. Statement: ${text}`);
  }
  const values: unknown[] = [];
  const converted = text.replace(/\$(\d+)|\?/g, (match, position: string | undefined) => {
    if (position === undefined) return '\\?';
    const index = Number(position) - 1;
    if (index < 0 || index >= parameters.length) {
      throw new Error(`The statement's placeholder ${match} has no parameter (${parameters.length} given). Statement: ${text}`);
    }
    values.push(parameters[index]);
    return '?';
  });
  return { text: converted, values };
}
