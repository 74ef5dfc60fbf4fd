// A small line chart drawn as inline SVG (no library): one line per series, axes, a legend and a table
// alternative for screen readers is drawn by the caller.
const NS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = String(text);
  return el;
}

// series: [{name, points: [[timeMs, value], ...]}]
export function lineChart(series, { title, format = (v) => String(v) } = {}) {
  const width = 900, height = 320, left = 70, right = 16, top = 16, bottom = 40;
  const all = series.flatMap((s) => s.points);
  const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': title });
  root.append(svg('title', {}, title));
  if (!all.length) {
    root.append(svg('text', { x: width / 2, y: height / 2, 'text-anchor': 'middle' }, 'No usage in this window.'));
    return root;
  }
  const times = all.map((p) => p[0]);
  const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 1);
  const vmax = Math.max(...all.map((p) => p[1]), 0) || 1;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
  const y = (v) => top + (1 - v / vmax) * (height - top - bottom);
  for (let i = 0; i <= 4; i++) {
    const v = (vmax * i) / 4;
    root.append(svg('line', { class: 'grid', x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    root.append(svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end' }, format(v)));
  }
  root.append(svg('line', { class: 'axis', x1: left, x2: width - right, y1: y(0), y2: y(0) }));
  root.append(svg('line', { class: 'axis', x1: left, x2: left, y1: top, y2: y(0) }));
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    const label = new Date(t).toISOString().slice(5, 16).replace('T', ' ');
    root.append(svg('text', { x: x(t), y: height - bottom + 18, 'text-anchor': 'middle' }, label));
  }
  series.forEach((s, i) => {
    const points = [...s.points].sort((a, b) => a[0] - b[0]);
    const d = points.map((p, j) => `${j ? 'L' : 'M'}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ');
    root.append(svg('path', { class: `line s${i % 12}`, d }));
    for (const p of points) {
      const dot = svg('circle', { class: `s${i % 12}`, cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 3 });
      dot.append(svg('title', {}, `${s.name}: ${format(p[1])}`));
      root.append(dot);
    }
  });
  return root;
}
