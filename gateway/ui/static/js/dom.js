// DOM helpers: every value becomes a text node or an attribute value, never markup.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') el.addEventListener(name.slice(2), value);
    else if (name === 'dataset') Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) { el.replaceChildren(); return el; }

export const fmt = {
  int: (n) => Number(n || 0).toLocaleString('en-US'),
  usd: (n) => '$' + Number(n || 0).toFixed(6),
  pct: (n) => (n === null || n === undefined) ? '–' : (100 * n).toFixed(1) + '%',
  ms: (n) => Number(n || 0).toFixed(1) + ' ms',
  time: (iso) => iso ? new Date(iso).toISOString().replace('T', ' ').slice(0, 16) + ' UTC' : '–',
};

// A figure in a <dl>, with the raw number kept in data-value (tests compare it with the API).
export function figure(label, value, text, name) {
  return h('div', { class: 'figure' }, h('dt', {}, label),
    h('dd', { dataset: { value: String(value), figure: name } }, text));
}

export function table(caption, columns, rows, attrs = {}) {
  const head = h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.num ? 'num' : null }, c.label)));
  const body = rows.map((row) => h('tr', { dataset: row.__data || {} }, columns.map((c) => {
    const value = c.value(row);
    const cell = h('td', { class: c.num ? 'num' : null, dataset: c.name ? { col: c.name } : {} });
    return append(cell, [c.format && !(value instanceof Node) ? c.format(value) : value]);
  })));
  if (!rows.length) body.push(h('tr', {}, h('td', { colspan: columns.length, class: 'muted' }, 'Nothing yet.')));
  return h('div', { class: 'table-wrap' }, h('table', attrs, h('caption', {}, caption), h('thead', {}, head), h('tbody', {}, body)));
}

export function field(id, label, input) {
  input.id = id;
  return h('div', {}, h('label', { for: id }, label), input);
}

export function message(el, text, ok = false) {
  el.className = ok ? 'ok' : 'error';
  el.textContent = text;
}
