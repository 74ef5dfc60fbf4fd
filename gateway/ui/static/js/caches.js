// Caches: hit rates in the window (usage records) and in this process (lookups), semantic hits with their
// verifier scores, feedback and shadow checks (estimated wrong-hit rate), and a flush per tenant.
import { admin, call, currentWindow } from './api.js';
import { field, fmt, h, message, table } from './dom.js';

const sum = (rows, match) => rows.filter(match).reduce((total, r) => total + r.value, 0);
const rate = (hit, miss) => (hit + miss ? hit / (hit + miss) : null);

export async function cachesPage(root, rerender) {
  const window = currentWindow();
  const [runtime, usage, tenants] = await Promise.all([
    call('GET', '/ui/api/runtime'), admin.get('usage', { group_by: 'cache_status', ...window }), admin.get('tenants'),
  ]);
  const c = runtime.cache;
  const count = (status) => (usage.data.find((r) => r.cache_status === status) || { requests: 0 }).requests;
  const [hit, semantic, miss] = [count('hit'), count('semantic-hit'), count('miss')];
  const looked = hit + semantic + miss;
  const shadow = (o) => sum(c.shadow, (r) => r.outcome === o);
  const wrong = rate(shadow('disagree'), shadow('agree'));
  const box = (label, value, name) => h('div', { class: 'figure' }, h('dt', {}, label), h('dd', { dataset: { figure: name } }, value));
  root.append(h('p', { class: 'muted' }, c.configured ? (c.semantic ? 'Exact and semantic caching are available.' : 'Exact caching only: semantic lookups are unavailable on this gateway.') : 'No cache is configured.'));
  root.append(h('h2', {}, 'In the window (usage records)'), h('dl', { class: 'cards' },
    box('Cacheable requests', fmt.int(looked), 'cacheable'),
    box('Exact hit rate', fmt.pct(looked ? hit / looked : null), 'exact_rate'),
    box('Semantic hit rate', fmt.pct(looked ? semantic / looked : null), 'semantic_rate'),
    box('Exact hits', fmt.int(hit), 'exact_hits'), box('Semantic hits', fmt.int(semantic), 'semantic_hits')));
  const lookup = (layer, result) => sum(c.lookups, (r) => r.layer === layer && r.result === result);
  root.append(h('h2', {}, 'This gateway process, since it started'), h('dl', { class: 'cards' },
    box('Exact lookups hit', fmt.pct(rate(lookup('exact', 'hit'), lookup('exact', 'miss'))), 'process_exact_rate'),
    box('Semantic lookups hit', fmt.pct(rate(lookup('semantic', 'hit'), lookup('semantic', 'miss'))), 'process_semantic_rate'),
    box('Hits reported wrong (header)', fmt.int(sum(c.feedback, (r) => r.source === 'header')), 'feedback_header'),
    box('Hits reported wrong (admin)', fmt.int(sum(c.feedback, (r) => r.source === 'admin')), 'feedback_admin'),
    box('Shadow checks agree / disagree', `${fmt.int(shadow('agree'))} / ${fmt.int(shadow('disagree'))}`, 'shadow'),
    box('Estimated wrong-hit rate', fmt.pct(wrong), 'wrong_rate')));
  root.append(table('Verified mode: labelled outcomes', [
    { label: 'Source', value: (r) => r.source }, { label: 'Outcome', value: (r) => r.outcome },
    { label: 'Count', num: true, value: (r) => r.value, format: fmt.int }], c.verified_outcomes || []));
  const status = h('p', { role: 'status' });
  root.append(table('Recent semantic hits (this process) and their verifier scores', [
    { label: 'Request id', value: (r) => r.request_id },
    { label: 'Namespace', value: (r) => r.namespace || '–' },
    { label: 'Similarity', num: true, value: (r) => r.similarity.toFixed(4) },
    { label: 'Verifier score', num: true, value: (r) => r.verifier.toFixed(4) },
    { label: 'Feedback', value: (r) => h('button', { type: 'button', class: 'secondary', 'data-writes': true, onclick: async () => {
      try { const out = await admin.post('cache/feedback', { request_id: r.request_id }); message(status, out.evicted ? 'Evicted and counted as wrong.' : 'No longer remembered here.', true); }
      catch (error) { message(status, error.message); } } }, 'Report wrong') },
  ], c.recent_semantic_hits || []), status);
  const tenant = h('select', { name: 'tenant' }, h('option', { value: '' }, '(every tenant)'), tenants.map((t) => h('option', { value: t.id }, `${t.id} — ${t.name}`)));
  const result = h('p', { role: 'status', id: 'flush-result' });
  const flush = h('form', { class: 'row card', id: 'cache-flush', 'data-writes': true }, field('flush-tenant', 'Flush the cache of', tenant), h('div', {}, h('button', { type: 'submit', class: 'danger' }, 'Flush')));
  flush.addEventListener('submit', async (event) => {
    event.preventDefault();
    const who = tenant.value || null;
    if (!confirm(who ? `Flush the cache of tenant ${who}?` : 'Flush the whole cache?')) return;
    try { const out = await admin.post('cache/flush', { tenant_id: who }); message(result, `Flushed ${fmt.int(out.flushed)} entries.`, true); }
    catch (error) { message(result, error.message); }
  });
  root.append(h('h2', {}, 'Flush'), flush, result);
}
