// Policies: a form for limits, budgets, models, cache, routing and cascade settings, checked by the admin
// API's own schema (/ui/api/validate/policy), with a diff of the stored policy before saving.
import { admin, call } from './api.js';
import { clear, field, h, message } from './dom.js';

const state = { id: null };
const LIMITS = [['rpm', 'Requests per minute'], ['tpm', 'Tokens per minute'], ['max_concurrent', 'Concurrent requests']];
const BUDGET = [['usd_per_day', 'USD per day'], ['usd_per_month', 'USD per month']];

export async function policiesPage(root, rerender) {
  const policies = await admin.get('policies');
  const picker = h('select', {}, h('option', { value: '' }, '(a new policy)'), policies.map((p) => h('option', { value: p.id, selected: p.id === state.id }, p.name)));
  picker.addEventListener('change', async () => { state.id = picker.value || null; await rerender(); });
  root.append(h('div', { class: 'row' }, field('policy-pick', 'Edit policy', picker)));
  const current = policies.find((p) => p.id === state.id) || null;
  root.append(policyForm(current, rerender));
}

const num = (value) => (value === null || value === undefined ? '' : String(value));

function policyForm(current, rerender) {
  const p = current || {};
  const input = (id, label, value, attrs = {}) => field(id, label, h('input', { name: id, value: num(value), autocomplete: 'off', ...attrs }));
  const numeric = { type: 'number', min: 0, step: 'any', inputmode: 'decimal' };
  const limits = (prefix, title, values = {}) => h('fieldset', {}, h('legend', {}, title),
    h('div', { class: 'grid form-grid' }, LIMITS.map(([k, label]) => input(`${prefix}-${k}`, label, values[k], { ...numeric, step: 1 }))));
  const budget = (prefix, title, values = {}) => h('fieldset', {}, h('legend', {}, title),
    h('div', { class: 'grid form-grid' }, BUDGET.map(([k, label]) => input(`${prefix}-${k}`, label, values[k], numeric))));
  const cache = p.cache || {};
  const semantic = typeof cache.semantic === 'object' && cache.semantic ? cache.semantic : { mode: cache.semantic === true ? 'static' : 'off' };
  const select = (id, label, options, value) => field(id, label, h('select', { name: id }, options.map(([v, text]) => h('option', { value: v, selected: v === (value ?? '') }, text))));
  const check = (id, label, on) => h('div', {}, h('input', { type: 'checkbox', id, name: id, checked: on }), h('label', { for: id }, label));
  const json = (id, label, value) => field(id, label, h('textarea', { name: id, spellcheck: 'false' }, JSON.stringify(value || {}, null, 2)));

  const form = h('form', { id: 'policy-form', novalidate: true, 'aria-describedby': 'policy-problems', 'data-writes': true },
    h('fieldset', {}, h('legend', {}, 'Policy'), h('div', { class: 'grid form-grid' },
      input('name', 'Name', p.name, { required: true, maxlength: 200 }),
      input('allowed_models', 'Allowed models (comma-separated; empty: all)', (p.allowed_models || []).join(', ')),
      input('reserve_completion_tokens', 'Completion tokens reserved for TPM (request sets none)', p.reserve_completion_tokens, { ...numeric, min: 1, step: 1 }),
      select('redis_failure_mode', 'When Redis is down', [['', "the gateway's setting"], ['open', 'open (local share)'], ['closed', 'closed (503)']], p.redis_failure_mode))),
    limits('key_limits', 'Limits per key', p.key_limits), limits('tenant_limits', "Limits on the tenant's total", p.tenant_limits),
    budget('key_budget', 'Budget per key', p.key_budget), budget('tenant_budget', 'Tenant budget', p.tenant_budget),
    h('fieldset', {}, h('legend', {}, 'Cache'), h('div', { class: 'grid form-grid' },
      check('cache-enabled', 'Cache on', cache.enabled !== false), check('cache-exact', 'Exact hits', cache.exact !== false),
      select('cache-semantic-mode', 'Semantic cache', [['off', 'off'], ['static', 'static'], ['verified', 'verified']], semantic.mode || 'off'),
      input('cache-semantic-max_error', 'Verified: largest wrong-hit share (δ)', semantic.max_error, { ...numeric, step: 'any' }),
      input('cache-ttl_s', 'Entry lifetime (s)', cache.ttl_s, { ...numeric, min: 1, step: 1 }))),
    h('fieldset', {}, h('legend', {}, 'Advanced (JSON)'), h('div', { class: 'grid form-grid' },
      json('model_limits', 'Per-model limits {alias: {rpm, tpm, max_concurrent}}', p.model_limits),
      json('routing', 'Routing (RoutingPolicy fields)', p.routing), json('cascade', 'Cascade (CascadePolicy fields)', p.cascade))),
    h('div', { class: 'row' }, h('button', { type: 'submit' }, 'Review changes')));
  const problems = h('div', { id: 'policy-problems', role: 'alert' });
  const review = h('section', { id: 'policy-review', 'aria-label': 'Changes to save' });
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(problems); clear(review);
    for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
    let body;
    try { body = readForm(form, p); } catch (error) { problems.append(h('p', { class: 'error' }, error.message)); return; }
    const verdict = await call('POST', '/ui/api/validate/policy', body);
    if (!verdict.valid) {
      problems.append(h('p', { class: 'error' }, 'The policy is not valid:'),
        h('ul', { class: 'error' }, verdict.problems.map((e) => h('li', {}, `${e.field}: ${e.message}`))));
      for (const e of verdict.problems) form.querySelector(`[name="${CSS.escape(e.field.replaceAll('.', '-'))}"]`)?.setAttribute('aria-invalid', 'true');
      return;
    }
    const before = current ? stripMeta(current) : {};
    review.append(h('h2', {}, current ? `Changes to “${current.name}”` : 'New policy'), diffView(before, body));
    const status = h('p', { role: 'status' });
    const save = h('button', { type: 'button', id: 'policy-save' }, current ? 'Save policy' : 'Create policy');
    save.addEventListener('click', async () => {
      try {
        const saved = current ? await admin.put(`policies/${encodeURIComponent(current.id)}`, body) : await admin.post('policies', body);
        state.id = saved.id;
        await rerender();
      } catch (error) { message(status, error.message); }
    });
    review.append(h('div', { class: 'row' }, save), status);
    save.focus();
  });
  return h('div', {}, form, problems, review);
}

function stripMeta(policy) {
  const { id, created_at, updated_at, ...rest } = policy;
  return rest;
}

function readForm(form, previous) {
  const get = (name) => form.elements[name].value.trim();
  const number = (name) => (get(name) === '' ? null : Number(get(name)));
  const section = (prefix, names) => Object.fromEntries(names.map(([k]) => [k, number(`${prefix}-${k}`)]));
  const parse = (name) => { try { return JSON.parse(get(name) || '{}'); } catch { throw new Error(`${name}: not valid JSON`); } };
  const models = get('allowed_models');
  const cache = { ...(previous.cache || {}) };
  cache.enabled = form.elements['cache-enabled'].checked;
  cache.exact = form.elements['cache-exact'].checked;
  cache.semantic = { mode: get('cache-semantic-mode') };
  if (number('cache-semantic-max_error') !== null) cache.semantic.max_error = number('cache-semantic-max_error');
  if (number('cache-ttl_s') !== null) cache.ttl_s = number('cache-ttl_s'); else delete cache.ttl_s;
  return {
    name: get('name'),
    allowed_models: models ? models.split(',').map((m) => m.trim()).filter(Boolean) : null,
    key_limits: section('key_limits', LIMITS), tenant_limits: section('tenant_limits', LIMITS),
    model_limits: parse('model_limits'),
    key_budget: section('key_budget', BUDGET), tenant_budget: section('tenant_budget', BUDGET),
    reserve_completion_tokens: number('reserve_completion_tokens'),
    redis_failure_mode: get('redis_failure_mode') || null,
    cache, routing: parse('routing'), cascade: parse('cascade'),
  };
}

// A line diff of the two policies as sorted, indented JSON.
function diffView(before, after) {
  const lines = (o) => JSON.stringify(sortKeys(o), null, 2).split('\n');
  const a = lines(before), b = lines(after);
  const out = h('pre', { class: 'diff', id: 'policy-diff' });
  const lcs = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) for (let j = b.length - 1; j >= 0; j--)
    lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  let i = 0, j = 0, changed = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) { out.append(h('span', {}, '  ' + a[i] + '\n')); i++; j++; }
    else if (j < b.length && (i >= a.length || lcs[i][j + 1] >= lcs[i + 1][j])) { out.append(h('span', { class: 'add' }, '+ ' + b[j] + '\n')); j++; changed++; }
    else { out.append(h('span', { class: 'del' }, '- ' + a[i] + '\n')); i++; changed++; }
  }
  return h('div', {}, h('p', {}, changed ? `${changed} changed line(s): – removed, + added.` : 'No changes.'), out);
}

function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === 'object') return Object.fromEntries(Object.keys(value).sort().map((k) => [k, sortKeys(value[k])]));
  return value;
}
