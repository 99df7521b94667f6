// Persons page: find a person by distinct id or by a property's value; show their
// properties, distinct ids, recent events, and the flags they get right now from the
// same evaluation /decide runs.
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
      FP.api('GET', `events?distinct_id=${encodeURIComponent(distinctId)}&limit=20`),
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
      props.length ? table(`${props.length} properties`, ['Property', 'Value'],
        props.map(([k, v]) => h('tr', {}, h('td', {}, h('code', {}, k)), h('td', {}, typeof v === 'string' ? v : JSON.stringify(v)))))
        : h('p', { class: 'muted' }, 'No properties.'),
      h('h3', {}, 'Recent events'),
      events.results.length ? table('The 20 newest', ['Time', 'Event', 'Distinct id', 'URL or library', 'Whole event'], events.results.map(FP.eventRow))
        : h('p', { class: 'muted' }, 'No events.'),
      h('p', {}, h('a', { href: `#/events/${encodeURIComponent(distinctId)}` }, 'All events of this distinct id'))))
  }

  async function render(main, [prefill]) {
    const by = h('select', { id: 'p-by' },
      h('option', { value: 'distinct_id' }, 'Distinct id'),
      h('option', { value: 'property' }, 'Property'))
    const prop = h('input', { id: 'p-prop', autocomplete: 'off', placeholder: 'email' })
    const propBox = h('div', { hidden: true }, h('label', { for: 'p-prop' }, 'Property name'), prop)
    const value = h('input', { id: 'p-value', autocomplete: 'off', required: true, value: prefill || '' })
    const out = h('div', { 'aria-live': 'polite', id: 'p-out' })
    by.addEventListener('change', () => { propBox.hidden = by.value !== 'property' })
    const form = h('form', { class: 'card', role: 'search', 'aria-label': 'Find a person' },
      h('div', { class: 'row' },
        h('div', {}, h('label', { for: 'p-by' }, 'Find by'), by),
        propBox,
        h('div', {}, h('label', { for: 'p-value' }, 'Value'), value),
        h('div', {}, h('button', { type: 'submit', class: 'primary' }, 'Find'))))
    async function find() {
      out.replaceChildren()
      const v = value.value.trim()
      if (!v) return out.append(FP.errorBox('Enter what to look for.'))
      if (by.value === 'distinct_id') {
        const found = await FP.api('GET', `persons?distinct_id=${encodeURIComponent(v)}`)
        if (!found.results.length) return out.append(h('p', {}, `No person has the distinct id ${v}.`))
        return showPerson(out, found.results[0], v)
      }
      const found = await FP.api('GET', `persons?property=${encodeURIComponent(prop.value.trim())}&value=${encodeURIComponent(v)}`)
      if (!found.results.length) return out.append(h('p', {}, 'No person matches.'))
      if (!found.complete) out.append(h('p', { class: 'muted' }, 'Only part of the persons was searched; narrow the search.'))
      out.append(table(`${found.results.length} matching`, ['Distinct ids', 'Created'], found.results.map((p) =>
        h('tr', {}, h('td', {}, p.distinct_ids.map((d, i) => [i ? ', ' : '', h('a', { href: `#/persons/${encodeURIComponent(d)}` }, d)])),
          h('td', {}, FP.fmt.time(p.created_at))))))
    }
    form.addEventListener('submit', (ev) => {
      ev.preventDefault()
      find().catch((err) => out.replaceChildren(FP.errorBox(err.message)))
    })
    main.replaceChildren(h('h1', {}, 'Persons'), form, out)
    if (prefill) await find()
    else value.focus()
  }

  FP.pages.persons = { id: 'persons', title: 'Persons', render }
})()
