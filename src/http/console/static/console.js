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

// One date format everywhere, the browser's own locale: the tables, the charts' axes
// and the date pickers (which the browser draws in that locale itself).
FP.fmt = {
  int: (n) => (n === null || n === undefined ? '–' : Number(n).toLocaleString()),
  time: (iso) => (iso ? new Date(iso).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'medium' }) : '–'),
  date: (d) => new Date(d).toLocaleDateString(undefined, { dateStyle: 'medium' }),
  clock: (d) => new Date(d).toLocaleTimeString(undefined, { timeStyle: 'short' }),
  /** A bucket's start as its table row and chart tick say it: a day, or a day and hour. */
  bucket: (d, seconds) => (seconds >= 86400 ? FP.fmt.date(d)
    : new Date(d).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' })),
  /** "1 property", "2 properties". */
  count: (n, one, many) => `${FP.fmt.int(n)} ${n === 1 ? one : many}`,
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

/** A modal question; resolves true when `yes` is chosen. Focus starts on Cancel and
 * returns to `opener` when it closes. */
FP.confirm = ({ title, text, yes, danger, opener }) => new Promise((resolve) => {
  const ok = h('button', { type: 'button', class: danger ? 'danger' : 'primary', value: 'yes' }, yes)
  const no = h('button', { type: 'button' }, 'Cancel')
  const titleId = `confirm-${Date.now()}`
  const dialog = h('dialog', { 'aria-labelledby': titleId, class: 'confirm' },
    h('h2', { id: titleId }, title), h('p', {}, text), h('div', { class: 'toolbar' }, ok, no))
  const close = (answer) => {
    dialog.close()
    dialog.remove()
    if (opener) opener.focus()
    resolve(answer)
  }
  ok.addEventListener('click', () => close(true))
  no.addEventListener('click', () => close(false))
  dialog.addEventListener('cancel', (ev) => { ev.preventDefault(); close(false) })
  document.body.append(dialog)
  dialog.showModal()
  no.focus()
})

/** A uPlot time axis for `seconds` buckets: ticks a whole bucket (or several) apart,
 * labelled in the browser's locale; an hourly axis names the day at midnight. */
FP.timeAxis = (seconds) => {
  const DAY = 86400
  const daily = seconds >= DAY
  return {
    space: daily ? 90 : 60,
    incrs: daily ? [DAY, 2 * DAY, 7 * DAY, 14 * DAY, 30 * DAY]
      : [3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, DAY, 2 * DAY, 7 * DAY],
    values: (u, ticks) => ticks.map((t) => {
      const d = new Date(t * 1000)
      return daily || (d.getHours() === 0 && d.getMinutes() === 0) ? FP.fmt.date(d) : FP.fmt.clock(d)
    }),
  }
}

/** A <datalist> of the property names captured (`of` events or persons); inputs point
 * at it with list="<id>". Asked again whenever such an input gets focus, so names
 * captured since the page opened are offered too. */
FP.propertyNames = (of, id) => {
  const list = h('datalist', { id })
  let asking = false
  const refresh = () => {
    if (asking) return
    asking = true
    FP.api('GET', `properties?of=${of}`)
      .then((r) => list.replaceChildren(...r.names.map((n) => h('option', { value: n }))))
      .catch(() => {})
      .finally(() => { asking = false })
  }
  const onFocus = (ev) => { if (ev.target instanceof Element && ev.target.getAttribute('list') === id) refresh() }
  document.addEventListener('focusin', onFocus)
  FP.onLeave(() => document.removeEventListener('focusin', onFocus))
  refresh()
  return list
}

/** Fill `list` with the captured values of property `key` (of events or persons). */
FP.propertyValues = (of, key, list) => {
  if (!key) return list.replaceChildren()
  FP.api('GET', `properties?of=${of}&key=${encodeURIComponent(key)}`)
    .then((r) => list.replaceChildren(...r.values.map((v) => h('option', { value: v }))))
    .catch(() => {})
}

/** The ranges the insights and flag pages offer. Days are the browser's local days:
 * "today" runs from local midnight to now, "last 7 days" from the midnight six days
 * before today's, so the range holds seven whole local days, today the last. */
FP.RANGES = [['today', 'Today'], ['yesterday', 'Yesterday'], ['7', 'Last 7 days'],
  ['30', 'Last 30 days'], ['90', 'Last 90 days'], ['custom', 'Custom range']]

/** {from, to} (Dates) of a range name; `custom` takes two yyyy-mm-dd texts, both days
 * included. */
FP.rangeOf = (name, first, last) => {
  const midnight = (daysBack) => {
    const d = new Date()
    d.setHours(0, 0, 0, 0)
    d.setDate(d.getDate() - daysBack)
    return d
  }
  if (name === 'today') return { from: midnight(0), to: new Date() }
  if (name === 'yesterday') return { from: midnight(1), to: midnight(0) }
  if (name === 'custom') {
    const [a, b] = [first, last].map((t) => (t ? new Date(`${t}T00:00:00`) : null))
    if (!a || !b || isNaN(a) || isNaN(b)) throw new Error('Choose the first and the last day of the range.')
    const end = new Date(b)
    end.setDate(end.getDate() + 1)
    if (end <= a) throw new Error('The last day must not be before the first.')
    return { from: a, to: end }
  }
  return { from: midnight(Number(name) - 1), to: new Date() }
}

/** A line chart of buckets (ISO starts) and series [{label, values}], drawn with the
 * vendored uPlot into `el`; returns the chart, to destroy when redrawn or left. */
FP.chart = (el, buckets, seconds, series) => {
  const COLOURS = ['#0b57d0', '#b45309', '#116329', '#9d174d', '#5b21b6', '#0e7490', '#4d7c0f', '#7c2d12', '#1e3a8a', '#701a75']
  el.replaceChildren()
  return new uPlot({
    width: Math.max(280, el.clientWidth || document.getElementById('main').clientWidth - 32),
    height: 320,
    series: [{ value: (u, t) => (t === null ? '–' : FP.fmt.bucket(t * 1000, seconds)) },
      ...series.map((s, i) => ({ label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2 }))],
    axes: [{ ...FP.timeAxis(seconds) }, { size: 60 }],
    scales: { x: { time: true } },
  }, [buckets.map((t) => Date.parse(t) / 1000), ...series.map((s) => s.values)], el)
}

/** PostHog's property operators as the search forms offer them: [operator, words]. */
FP.OPERATORS = [
  ['exact', 'equals'], ['is_not', 'does not equal'], ['icontains', 'contains'],
  ['not_icontains', 'does not contain'], ['regex', 'matches regex'], ['not_regex', 'does not match regex'],
  ['gt', 'greater than'], ['gte', 'at least'], ['lt', 'less than'], ['lte', 'at most'],
  ['is_set', 'is set'], ['is_not_set', 'is not set'],
  ['is_date_before', 'date before'], ['is_date_after', 'date after'],
  ['semver_gte', 'version at least'], ['semver_lt', 'version below'],
]

/** Replace an element's children as FP.h adds them: lists flattened, null left out. */
FP.fill = (el, ...children) => el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false))

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
