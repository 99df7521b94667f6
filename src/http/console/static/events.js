// Events page: the newest events with filters (name, distinct id, time range, a
// property tested with PostHog's operators, its names and values offered from what was
// captured), each
// openable as its whole JSON, and a live tail that asks for events newer than the
// newest shown every few seconds. Reads through the read API's own code.
'use strict'
;(() => {
  const h = FP.h
  /** How often the live tail asks for new events. */
  const TAIL_EVERY_MS = 2000
  const PAGE = 50

  function query(params) {
    const q = new URLSearchParams()
    for (const [k, v] of Object.entries(params)) if (v) q.set(k, v)
    return q.toString()
  }

  function eventRow(e) {
    const json = h('pre', {}, JSON.stringify(e, null, 2))
    return h('tr', { 'data-event': e.event, 'data-uuid': e.id },
      h('td', {}, FP.fmt.time(e.timestamp)),
      h('td', {}, h('code', {}, e.event)),
      h('td', {}, h('a', { href: `#/persons/${encodeURIComponent(e.distinct_id)}` }, e.distinct_id)),
      h('td', { class: 'hide-narrow' }, (e.properties && (e.properties.$current_url || e.properties.$lib)) || ''),
      h('td', {}, h('details', {}, h('summary', {}, 'JSON'), json)))
  }

  async function render(main, [prefill]) {
    const fields = {
      event: h('input', { id: 'ev-name', name: 'event', autocomplete: 'off' }),
      distinct_id: h('input', { id: 'ev-distinct', name: 'distinct_id', autocomplete: 'off', value: prefill || '' }),
      after: h('input', { id: 'ev-after', name: 'after', type: 'datetime-local' }),
      before: h('input', { id: 'ev-before', name: 'before', type: 'datetime-local' }),
      property: h('input', { id: 'ev-prop', name: 'property', autocomplete: 'off', list: 'ev-prop-names' }),
      operator: h('select', { id: 'ev-op', name: 'operator' }, FP.OPERATORS.map(([o, words]) => h('option', { value: o }, words))),
      value: h('input', { id: 'ev-value', name: 'value', autocomplete: 'off', list: 'ev-values' }),
    }
    const values = h('datalist', { id: 'ev-values' })
    fields.property.addEventListener('change', () => FP.propertyValues('events', fields.property.value.trim(), values))
    const live = h('input', { id: 'ev-live', type: 'checkbox' })
    const status = h('p', { role: 'status', 'aria-live': 'polite', class: 'muted', id: 'ev-status' })
    const body = h('tbody', { id: 'ev-rows' })
    const more = h('button', { type: 'button', hidden: true }, 'Older events')
    let next = null
    let newest = null
    let timer = null

    const params = () => ({
      event: fields.event.value.trim(),
      distinct_id: fields.distinct_id.value.trim(),
      after: fields.after.value ? new Date(fields.after.value).toISOString() : '',
      before: fields.before.value ? new Date(fields.before.value).toISOString() : '',
      ...(fields.property.value.trim() ? {
        property: fields.property.value.trim(), operator: fields.operator.value, value: fields.value.value.trim(),
      } : {}),
    })
    async function load() {
      const page = await FP.api('GET', `events?${query({ ...params(), limit: PAGE })}`)
      body.replaceChildren(...page.results.map(eventRow))
      newest = page.results.length ? page.results[0].timestamp : newest
      next = page.next
      more.hidden = !next
      const examined = page.examined ? ` (${FP.fmt.int(page.examined)} events examined)` : ''
      status.textContent = page.results.length ? `${FP.fmt.count(page.results.length, 'newest event', 'newest events')} shown${examined}.`
        : next ? `None of the newest events match${examined}; look at older ones.` : 'No events match.'
    }
    async function older() {
      const cursor = new URL(next, location.href).searchParams.get('cursor')
      const page = await FP.api('GET', `events?${query({ ...params(), limit: PAGE, cursor })}`)
      body.append(...page.results.map(eventRow))
      next = page.next
      more.hidden = !next
    }
    async function tail() {
      const p = params()
      // From the newest shown on (`after` includes its millisecond): events already
      // shown are told apart by their uuid.
      const after = newest || p.after
      const page = await FP.api('GET', `events?${query({ ...p, after, before: '', limit: 200 })}`)
      const shown = new Set([...body.querySelectorAll('tr')].map((r) => r.dataset.uuid))
      const fresh = page.results.filter((e) => !shown.has(e.id))
      if (fresh.length) {
        body.prepend(...fresh.map(eventRow))
        newest = fresh[0].timestamp
        status.textContent = `${fresh.length} new event${fresh.length === 1 ? '' : 's'} arrived.`
      }
    }
    const stop = () => { clearInterval(timer); timer = null }
    live.addEventListener('change', () => {
      stop()
      if (live.checked) {
        timer = setInterval(() => tail().catch((err) => { stop(); live.checked = false; status.replaceChildren(FP.errorBox(err.message)) }), TAIL_EVERY_MS)
        status.textContent = 'Live: new events appear at the top.'
      } else status.textContent = 'Live tail stopped.'
    })
    FP.onLeave(stop)
    more.addEventListener('click', () => older().catch((err) => status.replaceChildren(FP.errorBox(err.message))))
    const form = h('form', { class: 'card', role: 'search', 'aria-label': 'Filter events' },
      h('div', { class: 'row' },
        h('div', {}, h('label', { for: 'ev-name' }, 'Event name'), fields.event),
        h('div', {}, h('label', { for: 'ev-distinct' }, 'Distinct id'), fields.distinct_id),
        h('div', {}, h('label', { for: 'ev-after' }, 'After'), fields.after),
        h('div', {}, h('label', { for: 'ev-before' }, 'Before'), fields.before),
        h('div', {}, h('button', { type: 'submit', class: 'primary' }, 'Show events'))),
      h('div', { class: 'row' },
        h('div', {}, h('label', { for: 'ev-prop' }, 'Property'), fields.property),
        h('div', {}, h('label', { for: 'ev-op' }, 'Operator'), fields.operator),
        h('div', {}, h('label', { for: 'ev-value' }, 'Property value'), fields.value)),
      FP.propertyNames('events', 'ev-prop-names'), values,
      h('div', { class: 'inline' }, live, ' ', h('label', { for: 'ev-live' }, `Live tail (every ${TAIL_EVERY_MS / 1000} s)`)))
    form.addEventListener('submit', (ev) => {
      ev.preventDefault()
      load().catch((err) => status.replaceChildren(FP.errorBox(err.message)))
    })
    main.replaceChildren(
      h('h1', {}, 'Events'), form, status,
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, 'Time'), h('th', { scope: 'col' }, 'Event'),
          h('th', { scope: 'col' }, 'Distinct id'), h('th', { scope: 'col', class: 'hide-narrow' }, 'URL or library'),
          h('th', { scope: 'col' }, 'Whole event'))),
        body)),
      more)
    await load()
  }

  FP.pages.events = { id: 'events', title: 'Events', render }
  FP.eventRow = eventRow
})()
