// Usage: spend, tokens or requests over time by tenant, key or model (an inline-SVG chart and its table),
// and a CSV export of the same series.
import { admin, currentWindow, query } from './api.js';
import { field, fmt, h, table } from './dom.js';
import { lineChart } from './chart.js';

const state = { group: 'model', metric: 'cost_usd', bucket: '' };
const MAX_SERIES = 12; // policies/console_query.py
const TABLE_ROWS = 200; // the table shows the groups with the most spend (a month of 10,000 keys is 1.7 MB)
const METRICS = { cost_usd: ['Spend (USD)', fmt.usd], tokens: ['Tokens', fmt.int], requests: ['Requests', fmt.int] };

export async function usagePage(root, rerender) {
  const window = currentWindow();
  const seconds = (new Date(window.end) - new Date(window.start)) / 1000;
  const bucket = state.bucket || (seconds > 3 * 86400 ? 'day' : 'hour');
  const params = { group: state.group, bucket, ...window };
  // The totals come ranked by spend; their first ones are the series to draw (the API ranks alike).
  const totals = await admin.get('usage', { group_by: state.group, ...window, limit: TABLE_ROWS });
  const groups = totals.data.slice(0, MAX_SERIES).map((r) => r[state.group]);
  const series = await admin.get('usage/series', { ...params, groups: groups.length ? groups : null });
  const select = (id, label, options, value, key) => {
    const el = h('select', {}, options.map(([v, text]) => h('option', { value: v, selected: v === value }, text)));
    el.addEventListener('change', async () => { state[key] = el.value; await rerender(); });
    return field(id, label, el);
  };
  root.append(h('div', { class: 'row' },
    select('usage-group', 'By', [['model', 'model'], ['tenant_id', 'tenant'], ['key_id', 'key']], state.group, 'group'),
    select('usage-metric', 'Show', Object.entries(METRICS).map(([k, [label]]) => [k, label]), state.metric, 'metric'),
    select('usage-bucket', 'Per', [['', 'auto'], ['hour', 'hour'], ['day', 'day']], state.bucket, 'bucket'),
    h('div', {}, h('a', { href: '/ui/api/usage.csv' + query(params), download: 'llmgw-usage.csv', id: 'usage-csv' }, 'Export CSV'))));
  const [label, format] = METRICS[state.metric];
  const byGroup = new Map();
  for (const row of series.data) {
    if (!byGroup.has(row.group)) byGroup.set(row.group, []);
    byGroup.get(row.group).push([Date.parse(row.t), row[state.metric]]);
  }
  const lines = [...byGroup.entries()].map(([name, points]) => ({ name, points }));
  root.append(h('figure', { class: 'chart', id: 'usage-chart' },
    lineChart(lines, { title: `${label} per ${bucket} by ${state.group}`, format }),
    h('figcaption', {}, h('ul', { class: 'legend' }, lines.map((s, i) => h('li', {}, h('span', { class: `swatch s${i % 12}`, 'aria-hidden': 'true' }), s.name))))));
  const most = totals.data.length === TABLE_ROWS ? ` (the ${TABLE_ROWS} with the most spend)` : '';
  root.append(table(`Totals by ${state.group} in the window${most}`, [
    { label: state.group, value: (r) => r[state.group] },
    { label: 'Requests', num: true, value: (r) => r.requests, format: fmt.int },
    { label: 'Prompt tokens', num: true, value: (r) => r.prompt_tokens, format: fmt.int },
    { label: 'Completion tokens', num: true, value: (r) => r.completion_tokens, format: fmt.int },
    { label: 'Spend', num: true, value: (r) => r.cost_usd, format: fmt.usd },
    { label: 'Mean latency', num: true, value: (r) => r.avg_latency_ms, format: fmt.ms },
  ], totals.data.map((r) => ({ ...r, __data: { group: r[state.group] } })), { id: 'usage-table' }));
}
