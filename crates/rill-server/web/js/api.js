// HTTP helpers: the bearer key, JSON requests, and server-sent event streams.

const KEY_STORAGE = 'rill.apiKey';

export function getApiKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || '';
  } catch {
    return '';
  }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage unavailable: the key lives for this page only */
  }
  sessionKey = key;
}

let sessionKey = getApiKey();

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (sessionKey) h.Authorization = `Bearer ${sessionKey}`;
  return h;
}

/** An error from the server, with its OpenAI-shaped body when it had one. */
export class ApiError extends Error {
  constructor(status, body, fallback) {
    const msg = body && body.error && body.error.message ? body.error.message : fallback;
    super(status ? `${status}: ${msg}` : msg);
    this.status = status;
    this.body = body;
  }
}

async function failure(res) {
  let body = null;
  let text = '';
  try {
    text = await res.text();
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return new ApiError(res.status, body, text || res.statusText);
}

export async function getJson(path, { signal } = {}) {
  const res = await fetch(path, { headers: headers(false), signal });
  if (!res.ok) throw await failure(res);
  return res.json();
}

export async function postJson(path, body, { signal } = {}) {
  const res = await fetch(path, { method: 'POST', headers: headers(true), body: JSON.stringify(body), signal });
  if (!res.ok) throw await failure(res);
  return res.json();
}

/**
 * POSTs `body` and calls `onEvent(obj)` for every `data:` event of the SSE answer (JSON-parsed),
 * until `data: [DONE]` or the end of the stream. Rejects with ApiError on an HTTP error or an
 * `{"error": ...}` event; with an AbortError when `signal` aborts.
 */
export async function postStream(path, body, onEvent, { signal, onHeaders } = {}) {
  const res = await fetch(path, { method: 'POST', headers: headers(true), body: JSON.stringify(body), signal });
  if (!res.ok) throw await failure(res);
  if (onHeaders) onHeaders(res.headers);
  if (!res.body) throw new ApiError(0, null, 'the response has no body to stream');
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let done = false;
  const handle = (block) => {
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
    }
    if (!data.length) return;
    const payload = data.join('\n');
    if (payload.trim() === '[DONE]') {
      done = true;
      return;
    }
    let obj;
    try {
      obj = JSON.parse(payload);
    } catch {
      throw new ApiError(0, null, `unreadable event: ${payload.slice(0, 200)}`);
    }
    if (obj && obj.error) throw new ApiError(0, obj, 'error event');
    onEvent(obj);
  };
  try {
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let cut;
      while (!done && (cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        handle(block);
      }
    }
    if (!done && buf.trim()) handle(buf);
  } finally {
    if (!done) {
      try {
        await reader.cancel();
      } catch {
        /* already closed */
      }
    } else {
      reader.releaseLock();
    }
  }
}

export function isAbort(err) {
  return err && (err.name === 'AbortError' || err.code === 20);
}
