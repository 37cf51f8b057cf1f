/**
 * The store sends JSON as text (`$5::jsonb` with a string). postgres.js types each parameter as
 * the server describes it and would encode that string as JSON once more (a jsonb string, not
 * the object): a parameter cast to json or jsonb goes through text first.
 */
export function jsonAsText(text: string): string {
  return text.replace(/(\$\d+)::(jsonb?)\b/g, '$1::text::$2');
}
