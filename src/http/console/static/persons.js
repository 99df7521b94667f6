// Persons page: the stored persons newest first, a page at a time (the server's
// first-seen index, paged by cursor), or those whose property passes a test with
// PostHog's operators (names and values offered from what was captured; a search
// examines a bounded number of persons a page and says so), or whose distinct id starts
// with a text; or one person by distinct id, with their properties, distinct ids,
// recent events, and the flags they get right now from the evaluation /decide runs.
'use strict'
;(() => {
  const h = FP.h

  function table(caption, headers, rows) {
    return h('div', { class: 'table-wrap' }, h('table', {},
      h('caption', { class: 'muted' }, caption),
      h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows)))
  }

  async function showPerson(out, person, distinctId) {
    const [events, flags] = await Promise.all([
      // Every distinct id of the person, as PostHog's person page shows them.
      FP.api('GET', `events?person_id=${encodeURIComponent(person.id)}&limit=20`),
      FP.api('GET', `person_flags?distinct_id=${encodeURIComponent(distinctId)}`),
    ])
    const props = Object.entries(person.properties || {}).sort(([a], [b]) => a.localeCompare(b))
    const flagRows = Object.entries(flags.flags || {}).sort(([a], [b]) => a.localeCompare(b)).map(([key, f]) =>
      h('tr', { 'data-flag': key },
        h('td', {}, h('code', {}, key)),
        h('td', {}, f.variant ? f.variant : String(f.enabled)),
        h('td', { class: 'hide-narrow' }, (f.reason && f.reason.description) || '')))
    out.append(h('section', { class: 'card', 'aria-labelledby': 'person-title', id: 'person' },
      h('h2', { id: 'person-title' }, `Person ${distinctId}`),
      h('p', { class: 'muted' }, `id ${person.id} · first seen ${FP.fmt.time(person.created_at)}`),
      h('h3', {}, 'Distinct ids'),
      h('ul', { id: 'distinct-ids' }, (person.distinct_ids || []).map((d) => h('li', {}, h('code', {}, d)))),
      h('h3', {}, 'Flags right now'),
      flagRows.length ? table('What /decide answers for this person now', ['Flag', 'Value', 'Why'], flagRows)
        : h('p', { class: 'muted' }, 'The project has no flags.'),
      h('h3', {}, 'Properties'),
      props.length ? table(FP.fmt.count(props.length, 'property', 'properties'), ['Property', 'Value'],
        props.map(([k, v]) => h('tr', {}, h('td', {}, h('code', {}, k)), h('td', {}, typeof v === 'string' ? v : JSON.stringify(v)))))
        : h('p', { class: 'muted' }, 'No properties.'),
      h('h3', {}, 'Recent events'),
      events.results.length ? table('The 20 newest', ['Time', 'Event', 'Distinct id', 'URL or library', 'Whole event'], events.results.map(FP.eventRow))
        : h('p', { class: 'muted' }, 'No events.'),
      h('p', {}, h('a', { href: `#/events/${encodeURIComponent(distinctId)}` }, 'All events of this distinct id'))))
  }

  /** A page of the list: who, since when, and the first few properties. */
  function listTable(found, first, order) {
    return table(`Persons ${FP.fmt.int(first)} to ${FP.fmt.int(first + found.results.length - 1)}, ${order}`,
      ['Distinct ids', 'First seen', 'Properties'], found.results.map((p) => h('tr', { 'data-person': p.id },
        h('td', {}, p.distinct_ids.map((d, i) => [i ? ', ' : '', h('a', { href: `#/persons/${encodeURIComponent(d)}` }, d)])),
        h('td', {}, FP.fmt.time(p.created_at)),
        h('td', { class: 'hide-narrow' }, Object.entries(p.properties || {}).slice(0, 3)
          .map(([k, v]) => `${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`).join(' · ')))))
  }

  async function render(main, [prefill]) {
    const by = h('select', { id: 'p-by' },
      h('option', { value: 'distinct_id' }, 'Distinct id'),
      h('option', { value: 'distinct_id_prefix' }, 'Distinct id starts with'),
      h('option', { value: 'property' }, 'Property'))
    const prop = h('input', { id: 'p-prop', autocomplete: 'off', placeholder: 'email', list: 'p-prop-names' })
    const op = h('select', { id: 'p-op' }, FP.OPERATORS.map(([o, words]) => h('option', { value: o }, words)))
    const values = h('datalist', { id: 'p-values' })
    const propBox = h('div', { hidden: true }, h('label', { for: 'p-prop' }, 'Property name'), prop)
    const opBox = h('div', { hidden: true }, h('label', { for: 'p-op' }, 'Operator'), op)
    const value = h('input', { id: 'p-value', autocomplete: 'off', value: prefill || '' })
    const out = h('div', { 'aria-live': 'polite', id: 'p-out' })
    const pager = h('div', { class: 'toolbar', id: 'p-pager' })
    // No value for is_set / is_not_set, and a value again for the other ways to find.
    const valueNeeded = () => { value.disabled = by.value === 'property' && (op.value === 'is_set' || op.value === 'is_not_set') }
    by.addEventListener('change', () => {
      valueNeeded()
      propBox.hidden = opBox.hidden = by.value !== 'property'
      if (by.value === 'property') value.setAttribute('list', 'p-values')
      else value.removeAttribute('list')
    })
    prop.addEventListener('change', () => FP.propertyValues('persons', prop.value.trim(), values))
    op.addEventListener('change', valueNeeded)
    const form = h('form', { class: 'card', role: 'search', 'aria-label': 'Find persons' },
      h('div', { class: 'row' },
        h('div', {}, h('label', { for: 'p-by' }, 'Find by'), by),
        propBox, opBox,
        h('div', {}, h('label', { for: 'p-value' }, 'Value'), value),
        h('div', {}, h('button', { type: 'submit', class: 'primary' }, 'Find')),
        h('div', {}, h('button', { type: 'button', id: 'p-all', onclick: () => list(null, {}, []).catch(shown) }, 'All persons'))),
      FP.propertyNames('persons', 'p-prop-names'), values)
    const shown = (err) => out.replaceChildren(FP.errorBox(err.message))

    /**
     * A page of persons newest first (by distinct id for a prefix), filtered if
     * `filter` is set, starting `at` ({cursor} or, before the index is built,
     * {offset}); `back` holds where the pages before started and how many they showed.
     */
    async function list(filter, at, back) {
      out.replaceChildren()
      pager.replaceChildren()
      const q = new URLSearchParams({ limit: 50, ...(filter || {}), ...at })
      const found = await FP.api('GET', `persons?${q}`)
      const searching = filter && filter.property
      const first = 1 + back.reduce((n, b) => n + b.shown, 0)
      if (found.indexed === false) {
        out.append(h('p', { class: 'muted' }, 'The persons are still being indexed by first seen (the log shows the progress): until then the list reads every person.'))
      }
      if (searching) {
        out.append(h('p', { class: 'muted', id: 'p-searched' }, found.complete
          ? `Searched to the oldest person: ${FP.fmt.count(found.scanned, 'person', 'persons')} examined on this page.`
          : `${FP.fmt.count(found.scanned, 'person', 'persons')} examined on this page, newest first; a property search reads each person, so it stops there. “${found.results.length < 50 ? 'Search on' : 'Older persons'}” goes on from the last one.`))
      }
      if (found.results.length) {
        out.append(listTable(found, first, filter && filter.distinct_id_prefix ? 'by distinct id' : 'newest first'))
      } else {
        out.append(h('p', {}, filter ? 'No person matches on this page.' : 'No persons stored yet.'))
      }
      const page = { at, shown: found.results.length }
      if (back.length) {
        const before = back[back.length - 1]
        pager.append(h('button', { type: 'button', onclick: () => list(filter, before.at, back.slice(0, -1)).catch(shown) }, 'Newer persons'))
      }
      const next = found.next_cursor ? { cursor: found.next_cursor } : found.next_offset ? { offset: found.next_offset } : null
      if (next) {
        const label = searching && found.results.length < 50 ? 'Search on' : 'Older persons'
        pager.append(h('button', { type: 'button', id: 'p-next', onclick: () => list(filter, next, [...back, page]).catch(shown) }, label))
      }
    }

    async function find() {
      out.replaceChildren()
      pager.replaceChildren()
      const v = value.value.trim()
      if (by.value === 'distinct_id') {
        if (!v) return out.append(FP.errorBox('Enter a distinct id.'))
        const found = await FP.api('GET', `persons?distinct_id=${encodeURIComponent(v)}`)
        if (!found.results.length) return out.append(h('p', {}, `No person has the distinct id ${v}.`))
        return showPerson(out, found.results[0], v)
      }
      if (by.value === 'distinct_id_prefix') {
        if (!v) return out.append(FP.errorBox('Enter the start of a distinct id.'))
        return list({ distinct_id_prefix: v }, {}, [])
      }
      if (!prop.value.trim()) return out.append(FP.errorBox('Enter a property name.'))
      return list({ property: prop.value.trim(), operator: op.value, value: v }, {}, [])
    }
    form.addEventListener('submit', (ev) => {
      ev.preventDefault()
      find().catch(shown)
    })
    main.replaceChildren(h('h1', {}, 'Persons'), form, out, pager)
    if (prefill) await find()
    else await list(null, {}, [])
  }

  FP.pages.persons = { id: 'persons', title: 'Persons', render }
})()
