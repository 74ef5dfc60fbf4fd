// Tenants and keys: list, search, create; keys per tenant: create (secret shown once), revoke, rotate;
// today's spend against the tenant's daily budget.
import { admin } from './api.js';
import { clear, field, fmt, h, message, table } from './dom.js';

const SHOWN = 100;
const state = { tenant: null, search: '', secret: null };

function todayStart() {
  const now = new Date();
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate())).toISOString().replace('.000', '');
}

export async function tenantsPage(root, rerender) {
  const [tenants, policies, counts, usage] = await Promise.all([
    admin.get('tenants'), admin.get('policies'), admin.get('key-counts'),
    admin.get('usage', { group_by: 'tenant_id', start: todayStart() }),
  ]);
  const policyById = Object.fromEntries(policies.map((p) => [p.id, p]));
  const spend = Object.fromEntries(usage.data.map((r) => [r.tenant_id, r.cost_usd]));
  const keyCount = counts.data;
  const policyOptions = (none) => [h('option', { value: '' }, none), ...policies.map((p) => h('option', { value: p.id }, p.name))];

  const status = h('p', { role: 'status' });
  const create = h('form', { class: 'grid card', id: 'create-tenant', 'aria-label': 'Create a tenant', 'data-writes': true },
    field('tenant-id', 'Tenant id (optional)', h('input', { name: 'id', pattern: '[A-Za-z0-9_.:\\-]{1,64}', autocomplete: 'off' })),
    field('tenant-name', 'Name', h('input', { name: 'name', required: true, maxlength: 200, autocomplete: 'off' })),
    field('tenant-policy', 'Policy', h('select', { name: 'policy_id' }, policyOptions('(none)'))),
    h('div', {}, h('button', { type: 'submit' }, 'Create tenant')));
  create.addEventListener('submit', async (event) => {
    event.preventDefault();
    const form = new FormData(create);
    try {
      const made = await admin.post('tenants', { id: form.get('id') || null, name: form.get('name'), policy_id: form.get('policy_id') || null });
      state.tenant = made.id;
      await rerender();
    } catch (error) { message(status, error.message); }
  });
  root.append(h('h2', {}, 'Create a tenant'), create, status);

  const search = h('input', { type: 'search', value: state.search, autocomplete: 'off' });
  const results = h('div');
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    state.search = search.value;
    const found = tenants.filter((t) => !q || t.id.toLowerCase().includes(q) || t.name.toLowerCase().includes(q));
    clear(results).append(h('p', { class: 'muted' }, `${fmt.int(found.length)} of ${fmt.int(tenants.length)} tenants` + (found.length > SHOWN ? `; the first ${SHOWN} shown` : '')));
    results.append(table('Tenants', [
      { label: 'Id', value: (t) => t.id },
      { label: 'Name', name: 'name', value: (t) => t.name },
      { label: 'Policy', value: (t) => (policyById[t.policy_id] ? policyById[t.policy_id].name : '–') },
      { label: 'Active keys', num: true, value: (t) => keyCount[t.id] || 0, format: fmt.int },
      { label: 'Spend today', num: true, value: (t) => spend[t.id] || 0, format: fmt.usd },
      { label: 'Daily budget', value: (t) => budgetBar(spend[t.id] || 0, policyById[t.policy_id]) },
      { label: 'Keys', value: (t) => h('button', { type: 'button', class: 'secondary', onclick: async () => { state.tenant = t.id; await rerender(); } }, `Keys of ${t.id}`) },
    ], found.slice(0, SHOWN).map((t) => ({ ...t, __data: { tenant: t.id } })), { id: 'tenants-table' }));
  };
  search.addEventListener('input', draw);
  root.append(h('h2', {}, 'Tenants'), field('tenant-search', 'Search tenants by id or name', search), results);
  draw();

  if (state.tenant && tenants.some((t) => t.id === state.tenant)) {
    const keys = await admin.get('keys', { tenant_id: state.tenant });  // that tenant's keys only
    root.append(keysPanel(state.tenant, keys, policies, policyOptions, rerender));
  }
}

function budgetBar(spent, policy) {
  const limit = policy && policy.tenant_budget ? policy.tenant_budget.usd_per_day : null;
  if (limit === null || limit === undefined) return 'no budget';
  return h('span', {}, h('meter', { min: 0, max: limit, high: limit * 0.8, optimum: 0, value: Math.min(spent, limit), 'aria-label': `spend today against a budget of ${fmt.usd(limit)}` }),
    ` ${fmt.usd(spent)} of ${fmt.usd(limit)}`);
}

function keysPanel(tenantId, keys, policies, policyOptions, rerender) {
  const panel = h('section', { id: 'keys-panel', 'aria-labelledby': 'keys-title' }, h('h2', { id: 'keys-title' }, `Keys of ${tenantId}`));
  const status = h('p', { role: 'status' });
  if (state.secret) {
    panel.append(h('div', { class: 'card', role: 'alert' },
      h('p', {}, `New key ${state.secret.name ? '“' + state.secret.name + '” ' : ''}— copy it now, it is shown only once:`),
      h('p', { class: 'secret', id: 'new-key-secret' }, state.secret.key)));
    state.secret = null;
  }
  const create = h('form', { class: 'grid card', id: 'create-key', 'aria-label': 'Create a key', 'data-writes': true },
    field('key-name', 'Key name', h('input', { name: 'name', maxlength: 200, autocomplete: 'off' })),
    field('key-policy', 'Policy override', h('select', { name: 'policy_id' }, policyOptions("(the tenant's)"))),
    field('key-expiry', 'Expires (UTC date, optional)', h('input', { name: 'expires', type: 'date' })),
    h('div', {}, h('button', { type: 'submit' }, 'Create key')));
  create.addEventListener('submit', async (event) => {
    event.preventDefault();
    const form = new FormData(create);
    const expires = form.get('expires');
    try {
      state.secret = await admin.post('keys', { tenant_id: tenantId, name: form.get('name') || '', policy_id: form.get('policy_id') || null, expires_at: expires ? expires + 'T00:00:00Z' : null });
      await rerender();
    } catch (error) { message(status, error.message); }
  });
  const act = (label, cls, run) => h('button', { type: 'button', class: cls, 'data-writes': true, onclick: async () => {
    try { await run(); await rerender(); } catch (error) { message(status, error.message); }
  } }, label);
  const byId = Object.fromEntries(policies.map((p) => [p.id, p.name]));
  panel.append(create, status, table(`Keys of ${tenantId}`, [
    { label: 'Name', value: (k) => k.name || '–' },
    { label: 'Prefix', value: (k) => k.prefix },
    { label: 'Policy', value: (k) => byId[k.policy_id] || '–' },
    { label: 'Created', value: (k) => fmt.time(k.created_at) },
    { label: 'Expires', value: (k) => fmt.time(k.expires_at) },
    { label: 'State', name: 'state', value: (k) => (k.revoked_at ? 'revoked ' + fmt.time(k.revoked_at) : 'active') },
    { label: 'Actions', value: (k) => (k.revoked_at ? '' : h('span', {},
      act(`Revoke ${k.prefix}`, 'danger', () => confirm(`Revoke key ${k.prefix}? Calls with it fail at once.`) ? admin.post(`keys/${encodeURIComponent(k.id)}/revoke`) : null),
      ' ',
      act(`Rotate ${k.prefix}`, 'secondary', async () => {
        if (!confirm(`Rotate key ${k.prefix}: a new key is made and this one revoked?`)) return;
        state.secret = await admin.post('keys', { tenant_id: tenantId, name: k.name, policy_id: k.policy_id, expires_at: k.expires_at });
        await admin.post(`keys/${encodeURIComponent(k.id)}/revoke`);
      }))) },
  ], keys.map((k) => ({ ...k, __data: { key: k.id } })), { id: 'keys-table' }));
  return panel;
}
