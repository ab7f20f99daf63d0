// Small DOM, SVG and formatting helpers shared by the panels.

const SVG_NS = 'http://www.w3.org/2000/svg';

function set(node, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.setAttribute('class', v);
    else if (k === 'text') node.textContent = v;
    else if (k === 'style' && typeof v === 'object') Object.assign(node.style, v);
    else if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
}

function append(node, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** h('div', {class: 'x'}, child, 'text', [more]) */
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  set(node, attrs);
  append(node, children);
  return node;
}

/** s('rect', {x: 1}) : an SVG element */
export function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  set(node, attrs);
  append(node, children);
  return node;
}

/** Appends children, skipping null, undefined and false (unlike Node.append, which prints them). */
export function add(node, ...children) {
  append(node, children);
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

/** A token's text made visible: whitespace shown, control characters escaped. */
export function showToken(text) {
  if (text === undefined || text === null) return '';
  if (text === '') return '∅';
  return text
    .replace(/\n/g, '↵')
    .replace(/\t/g, '⇥')
    .replace(/\r/g, '␍')
    .replace(/^ /, '·')
    .replace(/ $/, '·')
    .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

/** A chip's text: spaces kept (white-space: pre), newlines drawn as ↵. */
export function chipText(text) {
  if (text === undefined || text === null) return '';
  if (text === '') return '∅';
  return text.replace(/\n/g, '↵').replace(/\t/g, '⇥').replace(/\r/g, '');
}

export function pct(p, digits = 1) {
  if (p === undefined || p === null || Number.isNaN(p)) return '–';
  if (p > 0 && p < 0.001) return '<0.1%';
  return `${(p * 100).toFixed(digits)}%`;
}

export function prob(p) {
  if (p === undefined || p === null || Number.isNaN(p)) return '–';
  if (p === 0) return '0';
  if (p < 0.0001) return p.toExponential(1);
  return p.toFixed(4);
}

export function num(x, digits = 2) {
  if (x === undefined || x === null || Number.isNaN(x)) return '–';
  return Number(x).toFixed(digits);
}

export function secs(x) {
  if (x === undefined || x === null || Number.isNaN(x)) return '–';
  if (x < 1e-3) return `${(x * 1e6).toFixed(0)} µs`;
  if (x < 1) return `${(x * 1e3).toFixed(1)} ms`;
  return `${x.toFixed(2)} s`;
}

export function bytes(b) {
  if (b === undefined || b === null || Number.isNaN(b)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = b;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function si(x, unit = '') {
  if (x === undefined || x === null || Number.isNaN(x)) return '–';
  const prefixes = [
    [1e15, 'P'],
    [1e12, 'T'],
    [1e9, 'G'],
    [1e6, 'M'],
    [1e3, 'k'],
  ];
  for (const [v, p] of prefixes) if (Math.abs(x) >= v) return `${(x / v).toFixed(2)} ${p}${unit}`;
  return `${Number(x).toFixed(0)} ${unit}`;
}

/** Colour of a probability in [0, 1]: red (unlikely) through amber to green (certain). */
export function probColor(p, light = 86) {
  const q = Math.max(0, Math.min(1, Number.isFinite(p) ? p : 0));
  const hue = Math.round(4 + 136 * q);
  return `hsl(${hue} 75% ${light}%)`;
}

export function probBorder(p) {
  return probColor(p, 42);
}

let idCounter = 0;
export function uid(prefix = 'id') {
  idCounter += 1;
  return `${prefix}-${idCounter}`;
}

/** A legend's entries: each swatch (`sw` classes) kept on one line with its words. */
export function legendItems(pairs) {
  return pairs.filter(Boolean).map(([cls, text]) => h('span', { class: 'legend-item' }, h('span', { class: `sw ${cls}` }), text));
}
