// Drive posthog-js-lite in Node (its CommonJS build, as `require('posthog-js-lite')`
// loads it) against a flagpost server and print a JSON summary on stdout.
//
//     node lite/node.mjs API_HOST PROJECT_KEY PREFIX
//
// The scenario (scenario.mjs) runs twice, each with a fresh client: with the
// client's default compression (gzip through Node's CompressionStream) and with
// `disableCompression`. Node has no window, so the client keeps its state in memory.
// The client calls the global `fetch`; it is wrapped to record every request with
// the events in it and the server's answer.

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { gunzipSync } from 'node:zlib'

import { scenario } from './scenario.mjs'

const [host, token, prefix] = process.argv.slice(2)
const deps = new URL('../node/package.json', import.meta.url)
const require = createRequire(deps)
const { PostHog } = require('posthog-js-lite')
const version = (name) =>
  JSON.parse(readFileSync(new URL(`node_modules/${name}/package.json`, deps))).version

let where = 'start'
const watchdog = setTimeout(() => {
  console.error(`timed out; last step: ${where}`)
  process.exit(2)
}, 90_000)

const requests = []
// What the client logs as an error (it logs through console).
const consoleErrors = []
const logError = console.error
console.error = (...args) => {
  consoleErrors.push(args.map(String).join(' '))
  logError(...args)
}
const realFetch = globalThis.fetch

async function bodyBytes(body) {
  if (body == null) return null
  if (typeof body === 'string') return Buffer.from(body)
  if (body instanceof Blob) return Buffer.from(await body.arrayBuffer())
  return Buffer.from(body)
}

globalThis.fetch = async (url, options = {}) => {
  const headers = Object.fromEntries(
    Object.entries(options.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v])
  )
  const parsed = new URL(url)
  const entry = {
    method: options.method ?? 'GET',
    url: String(url),
    path: parsed.pathname,
    query: parsed.search.slice(1),
    content_type: headers['content-type'] ?? null,
    content_encoding: headers['content-encoding'] ?? null,
    body: null,
    status: null,
    failure: null,
    events: [],
  }
  requests.push(entry)
  const bytes = await bodyBytes(options.body)
  if (bytes?.length) {
    const gzipped = bytes[0] === 0x1f && bytes[1] === 0x8b
    entry.body = gzipped ? 'gzip' : 'json'
    const json = JSON.parse((gzipped ? gunzipSync(bytes) : bytes).toString())
    if (parsed.pathname === '/batch/') entry.events = json.batch
    else entry.request = json
  }
  try {
    const response = await realFetch(url, options)
    entry.status = response.status
    if ((response.headers.get('content-type') ?? '').includes('json')) {
      entry.response = await response.clone().json().catch(() => null)
    }
    return response
  } catch (e) {
    entry.status = 0
    entry.failure = String(e?.cause ?? e)
    throw e
  }
}

const summary = {
  sdk: 'posthog-js-lite',
  version: version('posthog-js-lite'),
  core: version('@posthog/core'),
  node: process.version,
  runs: {},
}
for (const compression of ['on', 'off']) {
  const mark = requests.length
  const result = await scenario(PostHog, {
    host,
    token,
    prefix: `${prefix}-${compression}`,
    compression,
    step: (s) => {
      where = `${compression}: ${s}`
    },
  })
  summary.runs[compression] = { ...result, requests: requests.slice(mark) }
}
clearTimeout(watchdog)
summary.console_errors = consoleErrors
console.log(JSON.stringify(summary))
