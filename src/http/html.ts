/**
 * HTML built by a tagged template that escapes every interpolated value, so data (keys,
 * results, error messages, reasons: all of it hostile input) can only ever become text. Only
 * {@link SafeHtml}, made by this template, is inserted as markup.
 */

/** Markup made by {@link html}: safe to insert as it is. */
export class SafeHtml {
  readonly #text: string;

  constructor(text: string) {
    this.#text = text;
  }

  toString(): string {
    return this.#text;
  }
}

/** A value a template may interpolate: text (escaped), markup, or a list of either. */
export type HtmlValue = SafeHtml | string | number | boolean | null | undefined | readonly HtmlValue[];

/** `&`, `<`, `>`, `"` and `'` as character references: safe in text and in quoted attribute values. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/**
 * The template tag: `html\`<td>${key}</td>\`` escapes `key`. `null`, `undefined` and `false`
 * render as nothing; arrays render each element.
 */
export function html(strings: TemplateStringsArray, ...values: HtmlValue[]): SafeHtml {
  let out = strings[0]!;
  values.forEach((value, i) => {
    out += render(value) + strings[i + 1]!;
  });
  return new SafeHtml(out);
}

function render(value: HtmlValue): string {
  if (value === null || value === undefined || value === false) return '';
  if (value instanceof SafeHtml) return value.toString();
  if (Array.isArray(value)) return value.map(render).join('');
  return escapeHtml(String(value));
}
