// The console at <host>/console/ in a real headless Chromium, driven as a person would:
// sign in, create a flag with a condition through the form, switch it off, watch a new
// event arrive live, find a person, read the chart's numbers, look at health, sign out.
// axe-core checks every page; every request and console error is recorded. Prints a
// JSON summary on stdout's last line.
//
//     node console.mjs HOST PERSONAL_KEY PROJECT_KEY [SCREENSHOT_DIR]

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

import { WAIT_MS, failures, launch, record, sleep, until, watchdog } from './chromium.mjs'

const [host, personalKey, projectKey, shots] = process.argv.slice(2)
const run = watchdog(150_000)
const AXE = readFileSync(createRequire(new URL('../node/package.json', import.meta.url)).resolve('axe-core/axe.min.js'), 'utf8')
const AXE_VERSION = JSON.parse(readFileSync(new URL('../node/node_modules/axe-core/package.json', import.meta.url))).version
const summary = { axe: AXE_VERSION, accessibility: {}, steps: [] }

async function decide(distinctId, props) {
  const r = await fetch(`${host}/decide/?v=3`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ token: projectKey, distinct_id: distinctId, person_properties: props }),
  })
  return (await r.json()).featureFlags
}

async function capture(events) {
  const r = await fetch(`${host}/batch/`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ api_key: projectKey, batch: events }),
  })
  if (r.status !== 200) throw new Error(`capture answered ${r.status}`)
}

/** axe-core on the page as it is: the serious and critical violations, by rule. */
async function checkA11y(page, name) {
  await page.addScriptTag({ content: AXE })
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }))
  summary.accessibility[name] = result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`)
}

async function shoot(page, name) {
  if (shots) await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true })
}

const step = (name) => { run.step = name; summary.steps.push(name) }

const browser = await launch()
// The test injects axe-core as an inline script, which the console's own policy forbids.
const context = await browser.newContext({ bypassCSP: true, viewport: { width: 1200, height: 860 } })
context.setDefaultTimeout(WAIT_MS)
const log = await record(context, host)
const page = await context.newPage()

try {
  step('sign-in page')
  await page.goto(`${host}/console/`)
  await page.getByLabel('Personal API key').waitFor()
  await checkA11y(page, 'sign-in')
  await shoot(page, 'sign-in')

  step('sign in')
  await page.getByLabel('Personal API key').fill(personalKey)
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.locator('#new-flag').waitFor()
  summary.signed_in_as = await page.locator('#who').textContent()

  step('create a flag with a condition')
  await page.locator('#new-flag').click()
  await page.getByLabel('Key', { exact: true }).fill('console-made')
  await page.getByLabel('Name or description').fill('Made in the console')
  await page.getByRole('button', { name: 'Add property filter' }).click()
  await page.getByLabel('Property', { exact: true }).fill('plan')
  await page.getByLabel('Value', { exact: true }).fill('pro')
  await page.getByLabel('Rollout percentage').fill('100')
  await checkA11y(page, 'flag-form')
  await shoot(page, 'flag-form')
  await page.getByRole('button', { name: 'Create flag' }).click()
  await page.locator('tr[data-flag="console-made"]').waitFor()
  summary.decide_on = {
    pro: (await decide('ada', { plan: 'pro' }))['console-made'],
    free: (await decide('bob', { plan: 'free' }))['console-made'],
  }

  step('a validation error shown where it occurs')
  await page.locator('#new-flag').click()
  await page.getByLabel('Key', { exact: true }).fill('console-made')
  await page.getByRole('button', { name: 'Create flag' }).click()
  await page.locator('#key-error .error').waitFor()
  summary.duplicate_error = (await page.locator('#key-error').textContent()).trim()
  summary.duplicate_invalid = await page.getByLabel('Key', { exact: true }).getAttribute('aria-invalid')
  await page.getByRole('link', { name: 'Cancel' }).click()

  step('a rollout over 100 refused beside its condition group')
  await page.locator('#new-flag').click()
  await page.getByLabel('Key', { exact: true }).fill('too-much')
  await page.getByLabel('Rollout percentage').fill('130')
  await page.getByRole('button', { name: 'Create flag' }).click()
  await page.locator('#group-0-error .error').waitFor()
  summary.rollout_error = (await page.locator('#group-0-error').textContent()).trim()
  summary.rollout_invalid = await page.getByLabel('Rollout percentage').getAttribute('aria-invalid')
  await page.getByRole('link', { name: 'Cancel' }).click()

  step('switch it off')
  const toggle = page.getByRole('switch', { name: 'console-made enabled' })
  await toggle.click()
  await until('the switch to show off', async () => (await toggle.getAttribute('aria-checked')) === 'false')
  // An inactive flag is left out of /decide's answer, as PostHog leaves it out.
  const offAt = Date.now()
  await until('/decide to leave it out', async () => !('console-made' in (await decide('ada', { plan: 'pro' }))))
  summary.decide_off_within = Date.now() - offAt < 1000 ? 'a second' : `${Date.now() - offAt} ms`
  await checkA11y(page, 'flags')
  await shoot(page, 'flags')

  step('a new event appears live')
  await capture([{ event: '$identify', distinct_id: 'ada', properties: { $set: { plan: 'pro', email: 'ada@example.com' } } }])
  await page.goto(`${host}/console/#/events`)
  await page.getByLabel('Live tail (every 2 s)').check()
  await sleep(300)
  await capture([{ event: 'console live check', distinct_id: 'ada', properties: { n: 1 } }])
  await page.locator('tr[data-event="console live check"]').waitFor()
  summary.live_rows = await page.locator('tr[data-event="console live check"]').count()
  await page.locator('tr[data-event="console live check"] summary').first().click()
  summary.event_json = JSON.parse(await page.locator('tr[data-event="console live check"] pre').first().textContent()).properties.n
  await checkA11y(page, 'events')
  await shoot(page, 'events')

  step('switch it on again')
  await page.goto(`${host}/console/#/flags`)
  await toggle.click()
  await until('the switch to show on', async () => (await toggle.getAttribute('aria-checked')) === 'true')

  step('find a person')
  await page.goto(`${host}/console/#/persons`)
  await page.getByLabel('Value', { exact: true }).fill('ada')
  await page.getByRole('button', { name: 'Find' }).click()
  await page.locator('#person').waitFor()
  summary.person = {
    distinct_ids: await page.locator('#distinct-ids li').allTextContents(),
    flag_now: (await page.locator('#person tr[data-flag="console-made"] td').nth(1).textContent()).trim(),
  }
  await page.getByLabel('Find by').selectOption('property')
  await page.getByLabel('Property name').fill('email')
  await page.getByLabel('Value', { exact: true }).fill('ada@example.com')
  await page.getByRole('button', { name: 'Find' }).click()
  await page.locator('#p-out a').first().waitFor()
  summary.person_by_property = await page.locator('#p-out a').allTextContents()
  await page.getByLabel('Find by').selectOption('distinct_id')
  await page.getByLabel('Value', { exact: true }).fill('ada')
  await page.getByRole('button', { name: 'Find' }).click()
  await page.locator('#person').waitFor()
  await checkA11y(page, 'persons')
  await shoot(page, 'persons')

  step('chart numbers')
  await page.goto(`${host}/console/#/insights`)
  await page.getByLabel('Events').fill('console live check, $identify')
  await page.getByLabel('Range').selectOption('24')
  await page.getByLabel('Interval').selectOption('hour')
  await page.getByRole('button', { name: 'Show' }).click()
  await until('the chart', async () => (await page.locator('#in-numbers tr[data-event="$identify"]').count()) === 1)
  await page.locator('#in-chart canvas').waitFor()
  summary.chart_totals = {}
  for (const event of ['console live check', '$identify']) {
    summary.chart_totals[event] = Number(await page.locator(`#in-numbers tr[data-event="${event}"] td[data-total]`).getAttribute('data-total'))
  }
  await checkA11y(page, 'insights')
  await shoot(page, 'insights')

  step('health')
  await page.goto(`${host}/console/#/health`)
  await page.locator('#health-stats').waitFor()
  summary.health_errors = (await page.locator('#reload-errors').textContent()).trim()
  await checkA11y(page, 'health')
  await shoot(page, 'health')

  step('phone width')
  await page.setViewportSize({ width: 390, height: 844 })
  await page.goto(`${host}/console/#/flags`)
  await page.locator('tr[data-flag="console-made"]').waitFor()
  summary.phone_overflow = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth)
  await shoot(page, 'phone-flags')
  await page.setViewportSize({ width: 1200, height: 860 })

  step('cross-site requests refused')
  const cookie = (await context.cookies()).find((c) => c.name === 'flagpost_console')
  summary.cookie = { httpOnly: cookie.httpOnly, sameSite: cookie.sameSite, path: cookie.path }
  const token = await page.evaluate(() => window.FP.session.token)
  const attempt = async (headers) => (await fetch(`${host}/console/api/feature_flags/`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Cookie: `flagpost_console=${cookie.value}`, ...headers },
    body: JSON.stringify({ key: 'forged' }),
  })).status
  summary.cross_site = {
    foreign_origin: await attempt({ Origin: 'http://evil.example', 'X-Flagpost-Token': token }),
    no_token: await attempt({ Origin: host }),
  }

  step('sign out')
  await page.getByRole('button', { name: 'Sign out' }).click()
  await page.getByLabel('Personal API key').waitFor()
  summary.after_sign_out = (await fetch(`${host}/console/api/feature_flags/`, {
    headers: { Cookie: `flagpost_console=${cookie.value}` },
  })).status
} catch (err) {
  // Where it stopped, for the test's failure message.
  console.error(`failed at ${run.step}; the page showed:\n${await page.locator('main').innerText().catch(() => '?')}`)
  throw err
}

await until('every request to settle', async () => log.settled())
summary.failed_requests = failures(log)
summary.console_errors = log.console_errors
summary.page_errors = log.page_errors
summary.requests = log.requests.length
await browser.close()
run.done()
console.log(JSON.stringify(summary))
