/** A small HTTP client for the API tests: Node's fetch (undici), JSON in and out. */

export interface HttpResult {
  readonly status: number;
  readonly headers: Headers;
  /** Parsed JSON body, or the text when it is not JSON. */
  readonly body: any;
}

export interface RequestOptions {
  readonly token?: string;
  /** Idempotency-Key header (omitted when undefined). */
  readonly key?: string;
  /** JSON body (serialised) unless `rawBody` is given. */
  readonly json?: unknown;
  readonly rawBody?: string;
  readonly contentType?: string;
  readonly headers?: Record<string, string>;
}

export function httpClient(baseUrl: string) {
  const request = async (method: string, path: string, options: RequestOptions = {}): Promise<HttpResult> => {
    const headers: Record<string, string> = { ...options.headers };
    if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
    if (options.key !== undefined) headers['idempotency-key'] = options.key;
    let body: string | undefined;
    if (options.rawBody !== undefined) body = options.rawBody;
    else if (options.json !== undefined) body = JSON.stringify(options.json);
    if (body !== undefined || options.contentType !== undefined) headers['content-type'] = options.contentType ?? 'application/json';
    const response = await fetch(`${baseUrl}${path}`, { method, headers, body });
    const text = await response.text();
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON: keep the text
    }
    return { status: response.status, headers: response.headers, body: parsed };
  };
  return {
    request,
    post: (path: string, options?: RequestOptions) => request('POST', path, options),
    get: (path: string, options?: RequestOptions) => request('GET', path, options),
  };
}
