// The console at <host>/console/ in a real headless Chromium, driven as a person would:
// sign in, create a flag with a condition through the form, read its rules in words,
// switch it off (after saying no once to the confirmation), search and filter the
// flags, watch a new event arrive live, filter events by a property, list persons
// newest first and search them with an operator, open the flag's page (exposures,
// reach, history), read the chart's numbers over several ranges, look at health, see
// dates in another locale, sign out. axe-core checks every page; every request and
// console error is recorded. Prints a JSON summary on stdout's last line.
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

/** The yyyy-mm-dd of a time in the page's own time zone (a date input's value). */
const localDay = (page, ms) => page.evaluate((t) => {
  const d = new Date(t)
  const two = (n) => String(n).padStart(2, '0')
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}`
}, ms)

/** A console API read from inside the signed-in page. */
const consoleApi = (page, path) => page.evaluate((p) => window.FP.api('GET', p), path)

const TWO_DAYS_MS = 2 * 24 * 3600 * 1000
const browser = await launch()
// The test injects axe-core as an inline script, which the console's own policy forbids.
// A time zone off UTC, so local days are not UTC days.
const context = await browser.newContext({
  bypassCSP: true, viewport: { width: 1200, height: 860 }, locale: 'en-US', timezoneId: 'America/New_York',
})
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
  await page.locator('#flag-rules').waitFor()
  summary.created_notice = (await page.locator('main [role="status"]').textContent()).trim()
  summary.rules_in_words = (await page.locator('#flag-rules').textContent()).trim()
  summary.decide_on = {
    pro: (await decide('ada', { plan: 'pro' }))['console-made'],
    free: (await decide('bob', { plan: 'free' }))['console-made'],
  }

  step('a validation error shown where it occurs')
  await page.goto(`${host}/console/#/flags`)
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

  step('switch it off, after a confirmation')
  const toggle = page.getByRole('switch', { name: 'console-made enabled' })
  await toggle.click()
  await page.getByRole('dialog').waitFor()
  summary.confirm_text = (await page.getByRole('dialog').textContent()).trim()
  await page.getByRole('button', { name: 'Cancel' }).click()
  await sleep(300)
  summary.cancel_keeps = {
    switch: await toggle.getAttribute('aria-checked'),
    decide: (await decide('ada', { plan: 'pro' }))['console-made'],
  }
  await toggle.click()
  await page.getByRole('button', { name: 'Switch off' }).click()
  await until('the switch to show off', async () => (await toggle.getAttribute('aria-checked')) === 'false')
  // An inactive flag is left out of /decide's answer, as PostHog leaves it out.
  const offAt = Date.now()
  await until('/decide to leave it out', async () => !('console-made' in (await decide('ada', { plan: 'pro' }))))
  summary.decide_off_within = Date.now() - offAt < 1000 ? 'a second' : `${Date.now() - offAt} ms`
  await checkA11y(page, 'flags')
  await shoot(page, 'flags')

  step('search and filter the flags')
  const visible = () => page.locator('tbody tr[data-flag]:visible').evaluateAll((rows) => rows.map((r) => r.dataset.flag))
  const allFlags = await visible()
  await page.getByLabel('Search flags').fill('CONSOLE-M')
  summary.flag_search = await visible()
  await page.getByLabel('Search flags').fill('')
  await page.getByLabel('Status').selectOption('on')
  summary.flag_filter_on_hides_it = !(await visible()).includes('console-made') && (await visible()).length === allFlags.length - 1
  await page.getByLabel('Status').selectOption('off')
  summary.flag_filter_off = await visible()
  await page.getByLabel('Status').selectOption('')

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

  step('filter events by a property')
  await page.goto(`${host}/console/#/events`)
  await page.locator('#ev-rows tr').first().waitFor()
  await page.getByLabel('Property', { exact: true }).focus()
  await until('property names offered', async () => (await page.locator('#ev-prop-names option[value="n"]').count()) === 1)
  await page.getByLabel('Property', { exact: true }).fill('n')
  await page.getByLabel('Operator').selectOption('gt')
  await page.getByLabel('Property value').fill('0')
  await page.getByRole('button', { name: 'Show events' }).click()
  await until('only the matching events', async () => (await page.locator('#ev-rows tr').count()) === 1)
  summary.event_filter = await page.locator('#ev-rows tr').evaluateAll((rows) => rows.map((r) => r.dataset.event))
  summary.event_time_text = (await page.locator('#ev-rows td').first().textContent()).trim()
  summary.event_time_expected = await page.evaluate(async () => {
    const e = (await window.FP.api('GET', 'events?property=n&operator=gt&value=0')).results[0]
    return new Date(e.timestamp).toLocaleString('en-US', { dateStyle: 'medium', timeStyle: 'medium' })
  })

  step('switch it on again')
  await page.goto(`${host}/console/#/flags`)
  await toggle.click()
  summary.confirm_on_text = (await page.getByRole('dialog').textContent()).trim()
  await page.getByRole('button', { name: 'Switch on' }).click()
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
  await page.getByLabel('Property name').focus()
  await until('property names offered', async () => (await page.locator('#p-prop-names option[value="email"]').count()) === 1)
  await page.getByLabel('Property name').fill('email')
  await page.getByLabel('Operator').selectOption('icontains')
  await page.getByLabel('Value', { exact: true }).fill('EXAMPLE.COM')
  await page.getByRole('button', { name: 'Find' }).click()
  await page.locator('#p-out a').first().waitFor()
  summary.person_by_property = await page.locator('#p-out a').allTextContents()
  await page.getByLabel('Find by').selectOption('distinct_id')
  await page.getByLabel('Value', { exact: true }).fill('ada')
  await page.getByRole('button', { name: 'Find' }).click()
  await page.locator('#person').waitFor()
  await checkA11y(page, 'persons')
  await shoot(page, 'persons')

  step('persons newest first')
  const now = Date.now()
  await capture([
    { event: 'console union', distinct_id: 'early-bird', timestamp: new Date(now - TWO_DAYS_MS).toISOString(), properties: {} },
    { event: 'console union', distinct_id: 'late-bird', timestamp: new Date(now).toISOString(), properties: {} },
    { event: 'console union', distinct_id: 'late-bird', timestamp: new Date(now - TWO_DAYS_MS).toISOString(), properties: {} },
  ])
  await until('both persons stored', async () => {
    const ids = (await consoleApi(page, 'persons?limit=200')).results.flatMap((p) => p.distinct_ids)
    return ids.includes('early-bird') && ids.includes('late-bird')
  })
  await page.getByRole('button', { name: 'All persons' }).click()
  await page.locator('#p-out tr[data-person]').first().waitFor()
  summary.persons_newest_first = await page.locator('#p-out tr[data-person] td:first-child').allTextContents()
  await page.getByLabel('Find by').selectOption('property')
  await page.getByLabel('Property name').fill('email')
  await page.getByLabel('Operator').selectOption('is_not_set')
  await page.getByRole('button', { name: 'Find' }).click()
  // The click empties the list at once, so what appears is the search's answer.
  await until('the persons without an email', async () => (await page.locator('#p-out a').allTextContents()).includes('late-bird'))
  summary.persons_without_email = (await page.locator('#p-out a').allTextContents()).sort()
  summary.persons_search_note = (await page.locator('#p-searched').textContent()).trim()
  await page.getByLabel('Find by').selectOption('distinct_id_prefix')
  await page.getByLabel('Value', { exact: true }).fill('early')
  await page.getByRole('button', { name: 'Find' }).click()
  await until('the persons by prefix', async () => (await page.locator('#p-out a').allTextContents()).includes('early-bird'))
  summary.persons_by_prefix = await page.locator('#p-out a').allTextContents()
  await checkA11y(page, 'persons-list')

  step('the flag\'s page')
  await capture([true, true, false].map((v, i) => ({
    event: '$feature_flag_called', distinct_id: `viewer-${i}`, properties: { $feature_flag: 'console-made', $feature_flag_response: v },
  })))
  await until('the exposures counted', async () => {
    const x = await consoleApi(page, 'exposures?hours=1')
    return (x.flags['console-made'] || {}).false === 1
  })
  await page.goto(`${host}/console/#/flags`)
  await page.locator('tr[data-flag="console-made"] a').first().click()
  await page.locator('#fx-numbers td[data-value="true"]').first().waitFor()
  await page.locator('#flag-reach').waitFor()
  const column = async (v) => (await page.locator(`#fx-numbers td[data-value="${v}"]`).allTextContents()).reduce((a, t) => a + Number(t.replace(/\D/g, '')), 0)
  summary.flag_exposures = { true: await column('true'), false: await column('false') }
  summary.flag_reach = (await page.locator('#flag-reach').textContent()).trim()
  summary.flag_reach_examples = await page.locator('#flag-reach-examples a').allTextContents()
  summary.flag_history = await page.locator('#flag-history > li').evaluateAll((items) => items.map((li) => li.querySelector('ul') ? li.querySelector('ul').textContent.trim() : li.textContent.trim()))
  await checkA11y(page, 'flag-page')
  await shoot(page, 'flag-page')

  step('chart numbers')
  await page.goto(`${host}/console/#/insights`)
  const show = async (events, range, interval, measure) => {
    await page.getByLabel('Events').fill(events)
    await page.getByLabel('Range').selectOption(range)
    await page.getByLabel('Interval').selectOption(interval)
    await page.getByLabel('Count', { exact: true }).selectOption(measure)
    await page.evaluate(() => document.getElementById('in-table') && document.getElementById('in-table').remove())
    await page.getByRole('button', { name: 'Show' }).click()
    await page.locator('#in-table').waitFor()
  }
  const footer = async (event, what) => Number(await page.locator(`#in-table tfoot td[data-event="${event}"]`).getAttribute(`data-${what}`))
  const rows = async (column) => (await page.locator(`#in-table tbody tr`).evaluateAll((trs, c) => trs.map((tr) => Number(tr.children[c].textContent.replace(/\D/g, '') || 0)), column))
  await show('console live check, $identify', '7', 'day', 'total')
  await page.locator('#in-chart canvas').waitFor()
  summary.chart_totals = {}
  for (const event of ['console live check', '$identify']) summary.chart_totals[event] = await footer(event, 'total')
  summary.chart_days = await page.locator('#in-table tbody tr').count()
  summary.chart_day_label = (await page.locator('#in-table tbody th').last().textContent()).trim()
  summary.chart_day_expected = await page.evaluate(() => new Date().toLocaleDateString('en-US', { dateStyle: 'medium' }))
  await checkA11y(page, 'insights')
  await shoot(page, 'insights')
  await show('console union', '7', 'day', 'unique')
  summary.union = { buckets_summed: (await rows(1)).reduce((a, b) => a + b, 0), range_unique: await footer('console union', 'unique') }
  await show('console union', 'today', 'hour', 'total')
  summary.today = {
    total: await footer('console union', 'total'),
    hours: await page.locator('#in-table tbody tr').count(),
    hours_expected: await page.evaluate(() => new Date().getHours() + 1),
  }
  await page.getByLabel('Range').selectOption('custom')
  const twoDaysAgo = await localDay(page, now - TWO_DAYS_MS)
  await page.getByLabel('First day').fill(twoDaysAgo)
  await page.getByLabel('Last day').fill(twoDaysAgo)
  await show('console union', 'custom', 'day', 'unique')
  summary.custom_day = { rows: await page.locator('#in-table tbody tr').count(), unique: await footer('console union', 'unique'), total: await footer('console union', 'total') }

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
  // The new pages too: the flag's page with its chart, persons, insights' table.
  summary.phone_overflow_pages = {}
  for (const [name, hash, ready] of [
    ['flag', '#/flags', null], ['persons', '#/persons', '#p-out tr[data-person]'], ['insights', '#/insights', '#in-table'],
  ]) {
    await page.goto(`${host}/console/${hash}`)
    if (name === 'flag') {
      await page.locator('tr[data-flag="console-made"] a').first().click()
      await page.locator('#fx-numbers table').waitFor()
    } else await page.locator(ready).first().waitFor()
    summary.phone_overflow_pages[name] = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth)
  }
  await checkA11y(page, 'phone-flag-page')
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

  step('dates in the browser\'s locale')
  const german = await browser.newContext({ viewport: { width: 1200, height: 860 }, locale: 'de-DE', timezoneId: 'Europe/Berlin' })
  await german.addCookies([{ ...cookie }])
  const gpage = await german.newPage()
  await gpage.goto(`${host}/console/#/events`)
  await gpage.locator('#ev-rows td').first().waitFor()
  summary.german_event_time = (await gpage.locator('#ev-rows td').first().textContent()).trim()
  await german.close()

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
