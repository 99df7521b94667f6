// flagpost console: the shell every page shares. Element building (text only, never
// HTML from data), the JSON client that adds the session token to state-changing
// requests, sign-in and sign-out, and a hash router that clears a page's timers when
// it is left. Each page registers itself in FP.pages from its own file.
'use strict'

const FP = (window.FP = {
  pages: {},
  session: null,
  leaving: [],
})

/** An element: h('a', {href: '#', class: 'x', onclick: f}, 'text', child, ...). */
FP.h = function h(tag, attrs, ...children) {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v)
    else if (k === 'class') el.className = v
    else if (k === 'value') el.value = v
    else if (k === 'checked') el.checked = Boolean(v)
    else el.setAttribute(k, v === true ? '' : String(v))
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue
    el.append(c instanceof Node ? c : String(c))
  }
  return el
}
const h = FP.h

/** A request to /console/api/<path>; resolves to the JSON answer or throws an
 * Error carrying .status and the server's .body ({detail, attr, ...}). */
FP.api = async function api(method, path, body) {
  const headers = { Accept: 'application/json' }
  if (method !== 'GET' && FP.session) headers['X-Flagpost-Token'] = FP.session.token
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  const res = await fetch('api/' + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
  })
  const text = await res.text()
  let data = null
  try { data = text ? JSON.parse(text) : null } catch { data = { detail: text } }
  if (!res.ok) {
    const err = new Error((data && data.detail) || `request failed (${res.status})`)
    err.status = res.status
    err.body = data || {}
    if (res.status === 401 && path !== 'session') FP.signedOut(err.message)
    throw err
  }
  return data
}

FP.fmt = {
  int: (n) => (n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US')),
  time: (iso) => (iso ? new Date(iso).toLocaleString('en-GB', { hour12: false }) : '–'),
  bytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
    let i = 0
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++ }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`
  },
  seconds(s) {
    if (s === null || s === undefined) return '–'
    if (s < 120) return `${Math.round(s * 10) / 10} s`
    if (s < 7200) return `${Math.round(s / 60)} min`
    if (s < 172800) return `${Math.round(s / 3600)} h`
    return `${Math.round(s / 86400)} days`
  },
}

/** A paragraph saying what went wrong, announced to screen readers. */
FP.errorBox = (message) => h('p', { class: 'error', role: 'alert' }, message)

/** Run fn when the current page is left (timers, polling). */
FP.onLeave = (fn) => FP.leaving.push(fn)

FP.title = (text) => { document.title = `${text} · flagpost console` }

function showSignIn(message) {
  FP.session = null
  document.getElementById('nav').hidden = true
  document.getElementById('sign-out').hidden = true
  document.getElementById('who').textContent = ''
  FP.title('Sign in')
  const main = document.getElementById('main')
  const error = h('div', { id: 'signin-error', 'aria-live': 'polite' },
    message ? FP.errorBox(message) : null)
  const key = h('input', {
    id: 'key', name: 'key', type: 'password', autocomplete: 'current-password',
    required: true, spellcheck: 'false', 'aria-describedby': 'key-help signin-error',
  })
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in')
  const form = h('form', { class: 'card signin', novalidate: true },
    h('h1', {}, 'Sign in to the flagpost console'),
    h('label', { for: 'key' }, 'Personal API key'),
    key,
    h('p', { id: 'key-help', class: 'muted' },
      'A personal API key (phx_…) of your project from projects.json. You will see and change only that project.'),
    error,
    submit)
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault()
    error.replaceChildren()
    if (!key.value.trim()) {
      error.append(FP.errorBox('Enter a personal API key.'))
      key.setAttribute('aria-invalid', 'true')
      key.focus()
      return
    }
    submit.disabled = true
    try {
      FP.session = await FP.api('POST', 'session', { key: key.value.trim() })
      key.value = ''
      startApp()
    } catch (err) {
      key.setAttribute('aria-invalid', 'true')
      error.append(FP.errorBox(err.status === 429 ? err.message : `Sign-in failed: ${err.message}`))
      key.focus()
    } finally {
      submit.disabled = false
    }
  })
  main.replaceChildren(form)
  key.focus()
}

FP.signedOut = (message) => {
  leavePage()
  showSignIn(message || 'Your session ended. Sign in again.')
}

function leavePage() {
  for (const fn of FP.leaving.splice(0)) {
    try { fn() } catch (err) { console.warn(err) }
  }
}

function startApp() {
  const s = FP.session
  document.getElementById('nav').hidden = false
  document.getElementById('sign-out').hidden = false
  const project = s.project.name ? `${s.project.name} (project ${s.project.id})` : `project ${s.project.id}`
  document.getElementById('who').textContent = `${project} · ${s.signed_in_as}`
  if (!location.hash || location.hash === '#/' || location.hash === '#') location.hash = '#/flags'
  else route()
}

/** #/page/arg1/arg2 → FP.pages[page].render(main, [arg1, arg2]). */
async function route() {
  if (!FP.session) return
  leavePage()
  const [name, ...args] = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent)
  const page = FP.pages[name] || FP.pages.flags
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.getAttribute('href') === `#/${page.id}`) a.setAttribute('aria-current', 'page')
    else a.removeAttribute('aria-current')
  }
  const main = document.getElementById('main')
  main.replaceChildren(h('p', { class: 'muted' }, 'Loading…'))
  FP.title(page.title)
  try {
    await page.render(main, args)
  } catch (err) {
    if (err.status !== 401) main.replaceChildren(FP.errorBox(`Could not load this page: ${err.message}`))
  }
}

FP.go = (hash) => {
  if (location.hash === hash) route()
  else location.hash = hash
}

window.addEventListener('hashchange', route)
window.addEventListener('DOMContentLoaded', async () => {
  document.getElementById('sign-out').addEventListener('click', async () => {
    try { await FP.api('DELETE', 'session') } catch (err) { if (err.status !== 401) return }
    leavePage()
    showSignIn('You are signed out.')
  })
  try {
    const s = await FP.api('GET', 'session')
    if (!s.signed_in) return showSignIn()
    FP.session = s
    startApp()
  } catch (err) {
    showSignIn(`The console could not reach the server: ${err.message}`)
  }
})
