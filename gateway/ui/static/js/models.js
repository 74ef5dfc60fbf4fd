// Models and routing: aliases and their deployments, fallbacks, routing strategy, cascades, engine pools.
import { admin, call } from './api.js';
import { fmt, h, table } from './dom.js';
import { deploymentsTable } from './overview.js';

export async function modelsPage(root) {
  const [models, runtime] = await Promise.all([admin.get('models'), call('GET', '/ui/api/runtime')]);
  const routing = runtime.routing;
  const strategy = (alias) => routing.strategies[alias] || (routing.engine_pools.includes(alias) ? routing.engine_strategy : routing.default_strategy);
  root.append(table('Model aliases', [
    { label: 'Alias', value: (m) => m.name },
    { label: 'Source', value: (m) => m.source },
    { label: 'Deployments', value: (m) => m.config.deployments.map((d) => d.name).join(', ') },
    { label: 'Fallbacks', value: (m) => [...(m.config.fallbacks || []), ...((routing.defaults.fallbacks || {})[m.name] || [])].join(', ') || '–' },
    { label: 'Strategy', value: (m) => strategy(m.name) },
    { label: 'Engine pool', value: (m) => (routing.engine_pools.includes(m.name) ? 'yes' : 'no') },
  ], models));
  const deployments = models.flatMap((m) => m.config.deployments.map((d) => ({ alias: m.name, ...d })));
  root.append(table('Deployments as configured', [
    { label: 'Alias', value: (d) => d.alias },
    { label: 'Deployment', value: (d) => d.name },
    { label: 'Backend', value: (d) => d.backend || 'openai' },
    { label: 'Upstream', value: (d) => d.base_url || '–' },
    { label: 'Model', value: (d) => d.model || '–' },
    { label: 'Weight', num: true, value: (d) => d.weight },
    { label: '$ / 1M in', num: true, value: (d) => d.input_price_per_1m },
    { label: '$ / 1M out', num: true, value: (d) => d.output_price_per_1m },
  ], deployments));
  root.append(table('Cascades', [
    { label: 'Alias', value: (c) => c.alias },
    { label: 'Small', value: (c) => c.small },
    { label: 'Large', value: (c) => c.large },
    { label: 'Max small tokens', num: true, value: (c) => c.max_small_tokens ?? '–' },
    { label: 'Stream mode', value: (c) => c.stream_mode },
    { label: 'Confidence', value: (c) => JSON.stringify(c.confidence) },
  ], routing.cascades || []));
  root.append(h('h2', {}, 'Routing'));
  root.append(h('dl', { class: 'cards' },
    ...[['Default strategy', routing.default_strategy], ['Engine pools use', routing.engine_strategy],
      ['Attempts per alias', routing.max_attempts], ['Breaker opens after', `${routing.failures_to_open} failures`],
      ['Breaker cool-down', `${routing.open_cooldown_s} s`], ['Health checks', routing.health_checks ? `every ${routing.health_interval_s} s` : 'off']]
      .map(([label, value]) => h('div', { class: 'figure' }, h('dt', {}, label), h('dd', {}, String(value))))));
  root.append(h('h2', {}, 'Replicas now'));
  root.append(deploymentsTable(runtime.deployments));
  const engine = runtime.deployments.filter((d) => d.engine_pool);
  root.append(table('Engine pools: per-replica load and prefix hit rate', [
    { label: 'Pool', value: (d) => d.alias }, { label: 'Replica', value: (d) => d.deployment },
    { label: 'Running', num: true, value: (d) => d.running ?? '–' }, { label: 'Waiting', num: true, value: (d) => d.waiting ?? '–' },
    { label: 'KV usage', num: true, value: (d) => (d.kv_usage === null ? '–' : fmt.pct(d.kv_usage)) },
    { label: 'Prefix hit rate', num: true, value: (d) => (d.prefix_hit_rate === null ? '–' : fmt.pct(d.prefix_hit_rate)) },
  ], engine));
}
