// The console: sign-in, the page router (#/page) and the shared window selector.
import { call, setCsrf } from './api.js';
import { clear, h, message } from './dom.js';
import { overviewPage } from './overview.js';
import { tenantsPage } from './tenants.js';
import { policiesPage } from './policies.js';
import { modelsPage } from './models.js';
import { usagePage } from './usage.js';
import { cachesPage } from './caches.js';

const PAGES = {
  overview: ['Overview', overviewPage],
  tenants: ['Tenants and keys', tenantsPage],
  policies: ['Policies', policiesPage],
  models: ['Models and routing', modelsPage],
  usage: ['Usage', usagePage],
  caches: ['Caches', cachesPage],
};
const $ = (id) => document.getElementById(id);
let signedIn = false;
let scope = 'admin';

// A read-only session (an admin token with scope read): every control that would change something is
// disabled; the admin API refuses such calls anyway (403 insufficient_scope).
function lockChanges(root) {
  if (scope === 'admin') return;
  for (const el of root.querySelectorAll('[data-writes], [data-writes] input, [data-writes] select, [data-writes] textarea, [data-writes] button')) {
    el.disabled = true;
    el.setAttribute('aria-disabled', 'true');
    el.title = 'Read-only session: this token may not change anything';
  }
}

function setSession(session) {
  setCsrf(session.csrf);
  scope = session.scope || 'admin';
  document.body.dataset.scope = scope;
  $('read-only').hidden = scope === 'admin';
}

function showSignedIn(yes) {
  signedIn = yes;
  $('sign-in').hidden = yes;
  $('nav').hidden = !yes;
  $('session-tools').hidden = !yes;
  if (!yes) { clear($('page')); $('read-only').hidden = true; $('token').focus(); }
}

async function render() {
  if (!signedIn) return;
  const name = (location.hash.replace(/^#\//, '') || 'overview').split('?')[0];
  const [title, page] = PAGES[name] || PAGES.overview;
  for (const link of document.querySelectorAll('nav a')) {
    if (link.getAttribute('href') === '#/' + name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  document.title = title + ' · llmgw console';
  const root = clear($('page'));
  root.dataset.page = name;
  root.dataset.ready = 'false';
  const heading = h('h1', { tabindex: '-1' }, title);
  root.append(heading);
  const body = h('div');
  root.append(body);
  try {
    await page(body, render);
    lockChanges(root);
  } catch (error) {
    body.append(h('p', { class: 'error', role: 'alert' }, 'Could not load this page: ' + error.message));
  }
  root.dataset.ready = 'true';
}

async function start() {
  $('sign-in-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const session = await call('POST', '/ui/api/session', { token: $('token').value });
      $('token').value = '';
      setSession(session);
      showSignedIn(true);
      await render();
      $('main').focus();
    } catch (error) {
      message($('sign-in-error'), error.message);
    }
  });
  $('sign-out').addEventListener('click', async () => {
    try { await call('DELETE', '/ui/api/session'); } finally { setCsrf(''); showSignedIn(false); }
  });
  $('window').addEventListener('change', render);
  window.addEventListener('hashchange', async () => { await render(); document.querySelector('#page h1')?.focus(); });
  window.addEventListener('console:signed-out', () => showSignedIn(false));
  try {
    const session = await call('GET', '/ui/api/session');
    setSession(session);
    showSignedIn(true);
    await render();
  } catch {
    showSignedIn(false);
  }
}

start();
