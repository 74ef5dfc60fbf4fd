// Calls to the console's own endpoints; the session cookie goes along, changes carry the CSRF token.
let csrf = '';

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function setCsrf(token) { csrf = token || ''; }

export async function call(method, path, body) {
  const headers = { accept: 'application/json' };
  if (method !== 'GET') headers['x-csrf-token'] = csrf;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const response = await fetch(path, {
    method, headers, credentials: 'same-origin', cache: 'no-store',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: { message: text } }; }
  if (response.status === 401 && path !== '/ui/api/session') window.dispatchEvent(new Event('console:signed-out'));
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const admin = {
  get: (path, params) => call('GET', '/ui/api/admin/' + path + query(params)),
  post: (path, body) => call('POST', '/ui/api/admin/' + path, body ?? {}),
  put: (path, body) => call('PUT', '/ui/api/admin/' + path, body),
  patch: (path, body) => call('PATCH', '/ui/api/admin/' + path, body),
};

export function query(params) {
  if (!params) return '';
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    for (const v of [].concat(value)) if (v !== null && v !== undefined && v !== '') search.append(name, v);
  }
  const text = search.toString();
  return text ? '?' + text : '';
}

// The window chosen in the header, as the API's start/end (whole seconds, UTC).
export function currentWindow() {
  const seconds = Number(document.getElementById('window').value);
  const end = new Date(Math.ceil(Date.now() / 1000) * 1000 + 1000);
  const start = new Date(end.getTime() - seconds * 1000);
  return { start: start.toISOString().replace('.000', ''), end: end.toISOString().replace('.000', '') };
}
