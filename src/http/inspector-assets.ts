/**
 * The key inspector's static parts: the page, its one small script and its style sheet, served
 * as they are (no build step). The page holds no data; the script fetches each view as an HTML
 * fragment with the admin token in an `Authorization` header, so the browser never sends a
 * credential on its own (no cookie, no HTTP Basic): a page on another site cannot make it act.
 */

/**
 * Content-Security-Policy of every inspector response: scripts and styles only from this
 * origin (no inline script, so markup that escaped escaping still could not run), fetches only
 * to it, no forms posted by the browser (the script sends them), never framed.
 */
export const INSPECTOR_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
  "form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/** The page: a header with the search form, the token form, and `<main>` where views go. */
export const INSPECTOR_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Key inspector · idempotent-jobs</title>
<link rel="stylesheet" href="inspector.css">
<script type="module" src="inspector.js"></script>
</head>
<body>
<header>
<h1><a href="#/overview">Key inspector</a></h1>
<nav><a href="#/overview">Overview</a> <a href="#/keys?status=processing">Processing</a> <a href="#/keys?status=failed">Failed</a> <a href="#/keys">All keys</a></nav>
<form id="search" data-nav="/key">
<label>Scope <input name="scope" value="default" required maxlength="255"></label>
<label>Key <input name="key" required maxlength="255"></label>
<button type="submit">Find key</button>
</form>
</header>
<form id="token-form" hidden>
<p>The inspector needs an admin token (<code>ADMIN_TOKENS</code>). It is kept in this tab only (sessionStorage) and sent as <code>Authorization: Bearer …</code>.</p>
<label>Admin token <input name="token" type="password" autocomplete="off" required></label>
<button type="submit">Use token</button>
</form>
<main aria-live="polite"><p>Loading…</p></main>
<footer><button id="forget-token" type="button">Forget token</button></footer>
</body>
</html>
`;

/**
 * The page's script. Routes are `#/view?query`: each is fetched from `view/view?query` with
 * the token and its HTML put in `<main>` (the server escapes every value in it; the CSP
 * forbids inline script besides). Forms with `data-nav` become routes; forms with
 * `data-post` are sent as JSON (which a cross-site form cannot send) and their answer shown.
 */
export const INSPECTOR_SCRIPT = `const TOKEN = 'idempotent-jobs.admin-token';
const main = document.querySelector('main');
const tokenForm = document.getElementById('token-form');

function headers(extra) {
  const token = sessionStorage.getItem(TOKEN);
  return token ? { ...extra, authorization: 'Bearer ' + token } : extra;
}

async function show(request) {
  let response;
  try {
    response = await request;
  } catch (error) {
    main.textContent = 'The service did not answer (' + error.message + '). Reload to try again.';
    return;
  }
  main.innerHTML = await response.text();
  tokenForm.hidden = response.status !== 401;
  if (response.status === 401) tokenForm.elements.token.focus();
}

function route() {
  const hash = location.hash.slice(1);
  const path = /^\\/[a-z-]+(\\?.*)?$/.test(hash) ? hash : '/overview';
  return show(fetch('view' + path, { headers: headers({}), cache: 'no-store' }));
}

document.addEventListener('submit', (event) => {
  const form = event.target;
  event.preventDefault();
  if (form === tokenForm) {
    sessionStorage.setItem(TOKEN, form.elements.token.value.trim());
    form.reset();
    route();
    return;
  }
  const fields = Object.fromEntries(new FormData(form));
  if (form.dataset.nav) {
    const query = new URLSearchParams(Object.entries(fields).filter(([, value]) => value !== ''));
    const next = '#' + form.dataset.nav + (String(query) ? '?' + query : '');
    if (location.hash === next) route();
    else location.hash = next;
  } else if (form.dataset.post) {
    for (const button of form.querySelectorAll('button')) button.disabled = true;
    show(fetch('view' + form.dataset.post, {
      method: 'POST',
      headers: headers({ 'content-type': 'application/json' }),
      body: JSON.stringify(fields),
      cache: 'no-store',
    }));
  }
});

document.getElementById('forget-token').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN);
  route();
});
window.addEventListener('hashchange', route);
route();
`;

/** The style sheet: plain, readable, no framework. */
export const INSPECTOR_STYLE = `body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5rem 2rem; color: #1d2330; }
header { display: flex; flex-wrap: wrap; gap: 1rem 2rem; align-items: baseline; border-bottom: 1px solid #ccd; padding: .5rem 0; }
header h1 { font-size: 1.2rem; margin: 0; }
header a, nav a { margin-right: .8rem; }
a { color: #1f5fbf; }
form label { margin-right: .6rem; }
input, select, textarea, button { font: inherit; }
textarea { width: 36rem; max-width: 100%; vertical-align: top; }
table { border-collapse: collapse; margin: .4rem 0 1rem; }
th, td { border: 1px solid #dde; padding: .2rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f4f8; }
td { max-width: 32rem; overflow-wrap: anywhere; }
dl.key-fields { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dl.key-fields dt { font-weight: 600; }
dl.key-fields dd { margin: 0; overflow-wrap: anywhere; }
/* Keys, scopes and other chosen text: their direction stays inside (browsers isolate <bdi>; said
   again for any that do not), and their bidirectional controls show as marks. */
bdi { unicode-bidi: isolate; }
.bidi-control { font-size: .75em; padding: 0 .15em; border: 1px solid #c33; border-radius: .2em; color: #c33; unicode-bidi: isolate; direction: ltr; }
pre.json { background: #f6f7fa; border: 1px solid #dde; padding: .4rem; max-height: 20rem; overflow: auto; margin: .2rem 0; white-space: pre-wrap; overflow-wrap: anywhere; }
.status { padding: 0 .4rem; border-radius: .3rem; }
.status-processing { background: #fff1c2; }
.status-completed { background: #d8f5dc; }
.status-failed { background: #fbd7d7; }
.status-tombstone { background: #e4e4e4; }
.notice { padding: .4rem .6rem; border-radius: .3rem; }
.notice-done { background: #d8f5dc; }
.notice-refused { background: #fbd7d7; }
.hint, .empty { color: #5b6275; }
.paging a { margin-right: 1rem; }
#token-form { background: #f6f7fa; border: 1px solid #ccd; padding: .6rem; margin: 1rem 0; }
footer { margin-top: 2rem; }
`;
