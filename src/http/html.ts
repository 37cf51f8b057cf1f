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

/** Unicode's bidirectional formatting characters: marks, embeddings, overrides and isolates. */
const BIDI_CONTROLS = /([\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069])/;

/**
 * Text that others chose (a key, a scope, a step name, a reason) as a page shows it: isolated
 * in a `<bdi>`, so that its direction cannot reorder the page's own text around it (a key with
 * an unclosed right-to-left override would turn the "in scope …" after it around), and each of
 * its bidirectional controls shown as a visible mark (`U+202E`) instead of acting on the text:
 * `refund-\u202Efdp.exe` shows its override rather than passing for `refund-exe.pdf`.
 */
export function isolated(text: string): SafeHtml {
  const parts = text.split(BIDI_CONTROLS).map((part, i) => {
    if (i % 2 === 0) return part;
    const code = `U+${part.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`;
    return html`<span class="bidi-control" title="${code}: a bidirectional control character, shown instead of applied">${code}</span>`;
  });
  return html`<bdi>${parts}</bdi>`;
}
