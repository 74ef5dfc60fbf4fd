// Overview: the admin API's /overview figures for the chosen window, and this process's deployments.
import { admin, call, currentWindow } from './api.js';
import { figure, fmt, h, table } from './dom.js';

export async function overviewPage(root) {
  const window = currentWindow();
  const [data, runtime] = await Promise.all([admin.get('overview', window), call('GET', '/ui/api/runtime')]);
  const t = data.totals;
  root.dataset.start = window.start;
  root.dataset.end = window.end;
  root.id = 'overview';
  root.append(h('p', { class: 'muted' }, `From ${fmt.time(window.start)} to ${fmt.time(window.end)}.`));
  root.append(h('dl', { class: 'cards', 'aria-label': 'Totals' },
    figure('Requests', t.requests, fmt.int(t.requests), 'requests'),
    figure('Error rate', t.error_rate, fmt.pct(t.error_rate), 'error_rate'),
    figure('Prompt tokens', t.prompt_tokens, fmt.int(t.prompt_tokens), 'prompt_tokens'),
    figure('Completion tokens', t.completion_tokens, fmt.int(t.completion_tokens), 'completion_tokens'),
    figure('Spend', t.cost_usd, fmt.usd(t.cost_usd), 'cost_usd'),
    figure('Exact cache hits', t.exact_hits, fmt.int(t.exact_hits), 'exact_hits'),
    figure('Semantic cache hits', t.semantic_hits, fmt.int(t.semantic_hits), 'semantic_hits'),
    figure('Saved by cache hits', t.cache_saved_usd, fmt.usd(t.cache_saved_usd), 'cache_saved_usd'),
    figure('p50 latency', t.p50_latency_ms, fmt.ms(t.p50_latency_ms), 'p50_latency_ms'),
    figure('p95 latency', t.p95_latency_ms, fmt.ms(t.p95_latency_ms), 'p95_latency_ms'),
  ));
  const num = (label, name, format) => ({ label, name, num: true, value: (r) => r[name], format });
  root.append(table('Per model', [
    { label: 'Model', name: 'model', value: (r) => r.model },
    num('Requests', 'requests', fmt.int), num('Errors', 'errors', fmt.int), num('Error rate', 'error_rate', fmt.pct),
    num('Prompt tokens', 'prompt_tokens', fmt.int), num('Completion tokens', 'completion_tokens', fmt.int),
    num('Spend', 'cost_usd', fmt.usd), num('Exact hits', 'exact_hits', fmt.int), num('Semantic hits', 'semantic_hits', fmt.int),
    num('Saved by cache', 'cache_saved_usd', fmt.usd), num('p50', 'p50_latency_ms', fmt.ms), num('p95', 'p95_latency_ms', fmt.ms),
  ], data.models.map((r) => ({ ...r, __data: { model: r.model } })), { id: 'overview-models' }));
  const saved = {};
  for (const s of runtime.cache.saved_usd || []) saved[s.source] = (saved[s.source] || 0) + s.value;
  root.append(h('h2', {}, 'Savings since this gateway process started'));
  root.append(h('dl', { class: 'cards', 'aria-label': 'Savings since start' },
    figure('Cache (exact and semantic)', saved.cache || 0, fmt.usd(saved.cache || 0), 'process_saved_cache'),
    figure('Cascades, net of escalations', saved.cascade || 0, fmt.usd(saved.cascade || 0), 'process_saved_cascade'),
  ));
  root.append(h('h2', {}, 'Deployments'));
  root.append(deploymentsTable(runtime.deployments));
}

export function deploymentsTable(rows) {
  const maybe = (f) => (v) => (v === null || v === undefined ? '–' : f(v));
  return table('Deployments (health, breaker, load, engine KV usage)', [
    { label: 'Alias', value: (r) => r.alias },
    { label: 'Deployment', value: (r) => r.deployment },
    { label: 'Health', value: (r) => (r.healthy ? 'healthy' : 'unavailable') },
    { label: 'Breaker', value: (r) => r.breaker },
    { label: 'In flight', num: true, value: (r) => r.outstanding, format: fmt.int },
    { label: 'Queue', num: true, value: (r) => r.queue, format: fmt.int },
    { label: 'Latency (EWMA)', num: true, value: (r) => r.latency_ewma_ms, format: fmt.ms },
    { label: 'KV usage', num: true, value: (r) => r.kv_usage, format: maybe(fmt.pct) },
    { label: 'Prefix hit rate', num: true, value: (r) => r.prefix_hit_rate, format: maybe(fmt.pct) },
  ], rows);
}
