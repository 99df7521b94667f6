// What the browser scripts share: Debian's Chromium, headless and kept off the network,
// a static server for the test pages, and a recorder of every request a browser
// context makes, with the events in those that go to the intake.

import { readFileSync } from 'node:fs'
import http from 'node:http'
import { createRequire } from 'node:module'
import { gunzipSync } from 'node:zlib'

const deps = new URL('../node/', import.meta.url)
const { chromium } = createRequire(new URL('package.json', deps))('playwright-core')

/** posthog-js's installed package: its `dist/` is what the tests serve. */
export const POSTHOG_JS = new URL('node_modules/posthog-js/', deps)
export const POSTHOG_JS_VERSION = JSON.parse(readFileSync(new URL('package.json', POSTHOG_JS))).version

/** How long any single wait in a browser script may take. */
export const WAIT_MS = 20_000

// Headless, and nothing in the background: without --disable-background-networking
// and the rest, Chromium tries to reach Google. Even with them it still looks up
// update.googleapis.com and accounts.google.com, so no name resolves at all: the test
// uses 127.0.0.1 only. Playwright adds a fresh --user-data-dir on every launch.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
]

export function launch() {
  return chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_ARGS,
    timeout: WAIT_MS,
  })
}

/** Bound the whole run: the test harness kills us too, but this says where we were. */
export function watchdog(ms) {
  const state = { step: 'start' }
  const timer = setTimeout(() => {
    console.error(`timed out; last step: ${state.step}`)
    process.exit(2)
  }, ms)
  state.done = () => clearTimeout(timer)
  return state
}

/**
 * A static server on 127.0.0.1:0 for the site's own pages. `routes` maps a path to a
 * function returning [content type, body]; anything else is a 404.
 */
export async function servePages(routes) {
  const server = http.createServer((req, res) => {
    const route = routes[new URL(req.url, 'http://x').pathname]
    if (!route) return res.writeHead(404).end()
    const [type, body] = route()
    res.writeHead(200, { 'Content-Type': type }).end(body)
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { origin: `http://127.0.0.1:${server.address().port}`, close: () => server.close() }
}

export const isLoopback = (url) => ['127.0.0.1', 'localhost', '[::1]'].includes(new URL(url).hostname)

// A body as the server must read it: gzip by its magic bytes, base64 in a form's
// `data`, else JSON.
export function decode(body, contentType) {
  if (!body?.length) return { kind: 'empty', json: null }
  if (body[0] === 0x1f && body[1] === 0x8b) {
    return { kind: 'gzip', json: JSON.parse(gunzipSync(body).toString()) }
  }
  if ((contentType ?? '').startsWith('application/x-www-form-urlencoded')) {
    const data = new URLSearchParams(body.toString()).get('data')
    return { kind: 'base64', json: JSON.parse(Buffer.from(data, 'base64').toString()) }
  }
  return { kind: 'json', json: JSON.parse(body.toString()) }
}

// The events of an intake payload: an array of events or a batch object.
export function eventsOf(payload) {
  const batch = Array.isArray(payload) ? payload : (payload.batch ?? [payload])
  return batch.map((e) => ({
    uuid: e.uuid ?? null,
    event: e.event,
    distinct_id: e.properties?.distinct_id ?? e.distinct_id ?? null,
  }))
}

export const isIntake = (path) => /^\/(e|i\/v0\/e|batch|capture)\/?$/.test(path)

export async function until(what, fn, ms = WAIT_MS) {
  const deadline = Date.now() + ms
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/**
 * `promise`, or an error naming `what` after `ms`: posthog-js never calls some callbacks
 * when a request fails (getEarlyAccessFeatures, for one), and a wait on those must end
 * with a reason, not at the watchdog.
 */
export function within(what, promise, ms = WAIT_MS) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/**
 * Record what a browser context does: every request it makes (to any host), the
 * answer or failure of each, and the pages' console errors and uncaught exceptions.
 * Requests off loopback are aborted, and so show up as failed. With `bodies`, each
 * request to the API host keeps its decoded body as `payload` and its
 * `content_encoding`.
 */
export async function record(context, apiHost, { bodies = false } = {}) {
  const log = { requests: [], console_errors: [], page_errors: [] }
  await context.route(
    (url) => !isLoopback(url.href),
    (route) => route.abort()
  )
  const seen = new Map()
  context.on('request', (req) => {
    const url = new URL(req.url())
    const entry = {
      method: req.method(),
      url: req.url(),
      path: url.pathname,
      query: url.search.slice(1),
      status: null,
      failure: null,
      events: [],
    }
    if (req.url().startsWith(apiHost)) {
      const body = decode(req.postDataBuffer(), req.headers()['content-type'])
      entry.content_type = req.headers()['content-type'] ?? null
      entry.body = body.kind
      if (bodies) {
        entry.payload = body.json
        entry.content_encoding = req.headers()['content-encoding'] ?? null
      }
      if (isIntake(url.pathname)) entry.events = eventsOf(body.json)
    }
    seen.set(req, entry)
    log.requests.push(entry)
  })
  context.on('requestfinished', async (req) => {
    const entry = seen.get(req)
    if (!entry) return
    const response = await req.response()
    // The server's JSON answers (flags, surveys, early access) are kept: the test reads
    // what the server said, not only what posthog-js made of it. The status is set
    // last, so a settled request has its answer.
    if (req.url().startsWith(apiHost) && (response?.headers()['content-type'] ?? '').includes('json')) {
      entry.response = await response.json().catch(() => null)
    }
    entry.status = response?.status() ?? 0
  })
  context.on('requestfailed', async (req) => {
    const entry = seen.get(req)
    if (!entry) return
    entry.failure = req.failure()?.errorText ?? 'failed'
    // A request also fails when the page drops the body of an answer it got: keep
    // what the server said. The status is set last, as for a finished request.
    entry.answered = (await req.response().catch(() => null))?.status() ?? null
    entry.status = 0
  })
  context.on('console', (m) => {
    if (m.type() === 'error') log.console_errors.push(m.text())
  })
  context.on('weberror', (e) => log.page_errors.push(String(e.error())))
  log.sent = () => log.requests.flatMap((r) => r.events)
  log.settled = () => log.requests.every((r) => r.status !== null)
  return log
}

/** Requests that failed or were answered with an error: none is the only good answer. */
export function failures(log) {
  return log.requests
    .filter((r) => r.failure !== null || r.status >= 400)
    .map((r) => `${r.method} ${r.url}: ${r.failure ?? r.status}`)
}
