// Flags page: the project's flags with their state, rollout and exposures in the last
// 24 hours, searchable by key or name and filtered by state; switching on and off
// (after a confirmation naming who it affects) and deleting go through the management
// API's PATCH, exactly as an API client would.
'use strict'
;(() => {
  const h = FP.h

  /** "50% of everyone; 100% where 2 conditions" and the variants' split. */
  function rollout(flag) {
    const f = flag.filters || {}
    const groups = (f.groups || []).map((g) => {
      const pct = g.rollout_percentage === null || g.rollout_percentage === undefined ? 100 : g.rollout_percentage
      const n = (g.properties || []).length
      return n ? `${pct}% where ${FP.fmt.count(n, 'condition', 'conditions')}` : `${pct}% of everyone`
    })
    let text = groups.length ? groups.join('; ') : 'no condition groups (off for everyone)'
    const variants = (f.multivariate && f.multivariate.variants) || []
    if (variants.length) text += ` · variants ${variants.map((v) => `${v.key} ${v.rollout_percentage}%`).join(', ')}`
    return text
  }

  async function render(main) {
    const [list, exposures] = await Promise.all([
      FP.api('GET', 'feature_flags/?limit=1000'),
      FP.api('GET', 'exposures?hours=24'),
    ])
    const status = h('p', { role: 'status', 'aria-live': 'polite', class: 'notice', id: 'flags-status' })
    if (FP.flash) { status.textContent = FP.flash; FP.flash = null }
    const rows = list.results.map((flag) => row(flag, exposures.flags[flag.key] || {}, status))
    const caption = h('caption', { class: 'muted' })
    const body = h('tbody', {}, rows)
    const table = h('div', { class: 'table-wrap' }, h('table', {},
      caption,
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Key'),
        h('th', { scope: 'col', class: 'hide-narrow' }, 'Name'),
        h('th', { scope: 'col' }, 'Status'),
        h('th', { scope: 'col', class: 'hide-narrow' }, 'Rollout'),
        h('th', { scope: 'col', class: 'num' }, 'Exposures (24 h)'),
        h('th', { scope: 'col' }, 'Actions'))),
      body))
    const search = h('input', { id: 'flag-search', type: 'search', autocomplete: 'off', placeholder: 'key or name' })
    const state = h('select', { id: 'flag-state' },
      h('option', { value: '' }, 'All'), h('option', { value: 'on' }, 'On'), h('option', { value: 'off' }, 'Off'))
    const filter = () => {
      const words = search.value.trim().toLowerCase()
      let shown = 0
      for (const tr of rows) {
        const f = tr.flag
        const text = `${f.key} ${f.name || ''}`.toLowerCase()
        const fits = (!words || text.includes(words)) && (!state.value || (state.value === 'on') === f.active)
        tr.hidden = !fits
        if (fits) shown++
      }
      caption.textContent = shown === list.count ? FP.fmt.count(list.count, 'flag', 'flags')
        : `${FP.fmt.int(shown)} of ${FP.fmt.count(list.count, 'flag', 'flags')} shown`
    }
    search.addEventListener('input', filter)
    state.addEventListener('change', filter)
    FP.refilterFlags = filter
    filter()
    const tools = h('form', { class: 'toolbar', role: 'search', 'aria-label': 'Find flags', onsubmit: (ev) => ev.preventDefault() },
      h('div', {}, h('label', { for: 'flag-search' }, 'Search flags'), search),
      h('div', {}, h('label', { for: 'flag-state' }, 'Status'), state))
    const upstream = FP.syncedFrom()
    main.replaceChildren(
      h('h1', {}, 'Feature flags'),
      upstream
        ? h('p', { class: 'notice', id: 'synced-from' }, 'Read-only: these flags are synced from ', h('code', {}, upstream), '; change them there.')
        : h('div', { class: 'toolbar' },
          h('a', { href: '#/flag/new', class: 'button primary', id: 'new-flag' }, 'New flag')),
      status,
      ...(list.count ? [tools, table] : [h('p', { class: 'muted' }, 'No flags yet. Create the first one.')]))
  }

  function row(flag, exposed, status) {
    const total = Object.values(exposed).reduce((a, b) => a + b, 0)
    const split = Object.entries(exposed).map(([v, n]) => `${v}: ${FP.fmt.int(n)}`).join(', ')
    const toggle = FP.flagSwitch(flag, status, () => { if (FP.refilterFlags) FP.refilterFlags() })
    const remove = h('button', { type: 'button', class: 'danger', 'aria-label': `Delete ${flag.key}` }, 'Delete')
    remove.addEventListener('click', () => confirmDelete(flag, status, remove))
    const tr = h('tr', { 'data-flag': flag.key },
      h('td', {}, h('a', { href: `#/flag/${flag.id}` }, h('code', {}, flag.key))),
      h('td', { class: 'hide-narrow' }, flag.name || ''),
      h('td', {}, FP.syncedFrom() ? (flag.active ? 'on' : 'off') : toggle),
      h('td', { class: 'hide-narrow' }, rollout(flag)),
      h('td', { class: 'num', title: split || 'no exposures' }, FP.fmt.int(total)),
      h('td', {}, FP.syncedFrom() ? h('span', { class: 'muted' }, 'synced')
        : [h('a', { href: `#/flag/${flag.id}/edit`, 'aria-label': `Edit ${flag.key}` }, 'Edit'), ' ', remove]))
    tr.flag = flag
    return tr
  }

  /** The upstream this project's flags are synced from (edge mode), or null. */
  FP.syncedFrom = () => (FP.session && FP.session.project && FP.session.project.synced_from) || null

  /** Who switching the flag on would reach, in words, for the confirmation. */
  function reachWords(flag) {
    const groups = (flag.filters && flag.filters.groups) || []
    if (!groups.length) return 'It has no condition groups, so it stays off for everyone.'
    return `It then answers true (or a variant) to ${rollout(flag)}.`
  }

  /** The on/off switch of a flag: asks first, then PATCHes `active`. */
  FP.flagSwitch = (flag, status, after) => {
    const toggle = h('button', {
      type: 'button', class: 'switch', role: 'switch', 'aria-checked': String(flag.active),
      'aria-label': `${flag.key} enabled`, 'data-flag': flag.key,
    }, flag.active ? 'On' : 'Off')
    toggle.addEventListener('click', async () => {
      const on = !flag.active
      const sure = await FP.confirm({
        title: `Switch ${flag.key} ${on ? 'on' : 'off'}?`,
        text: on ? reachWords(flag) : 'Every user then gets false for it from /decide within a second.',
        yes: `Switch ${on ? 'on' : 'off'}`,
        danger: !on,
        opener: toggle,
      })
      if (!sure) return
      toggle.disabled = true
      try {
        const updated = await FP.api('PATCH', `feature_flags/${flag.id}/`, { active: on })
        flag.active = updated.active
        flag.version = updated.version
        toggle.setAttribute('aria-checked', String(flag.active))
        toggle.textContent = flag.active ? 'On' : 'Off'
        status.textContent = `${flag.key} is now ${flag.active ? 'on' : 'off'}.`
        if (after) after()
      } catch (err) {
        status.replaceChildren(FP.errorBox(`Could not switch ${flag.key}: ${err.message}`))
      } finally {
        toggle.disabled = false
        toggle.focus()
      }
    })
    return toggle
  }

  function confirmDelete(flag, status, opener) {
    const yes = h('button', { type: 'button', class: 'danger', value: 'delete' }, `Delete ${flag.key}`)
    const no = h('button', { type: 'button' }, 'Cancel')
    const error = h('div', { 'aria-live': 'polite' })
    const dialog = h('dialog', { 'aria-labelledby': 'delete-title' },
      h('h2', { id: 'delete-title' }, `Delete the flag ${flag.key}?`),
      h('p', {}, 'It stops being served by /decide at once. Its history stays in the activity log.'),
      error,
      h('div', { class: 'toolbar' }, yes, no))
    const close = () => { dialog.close(); dialog.remove(); opener.focus() }
    no.addEventListener('click', close)
    dialog.addEventListener('cancel', (ev) => { ev.preventDefault(); close() })
    yes.addEventListener('click', async () => {
      yes.disabled = true
      try {
        await FP.api('PATCH', `feature_flags/${flag.id}/`, { deleted: true })
        dialog.close()
        dialog.remove()
        FP.flash = `${flag.key} was deleted.`
        FP.go('#/flags')
      } catch (err) {
        error.replaceChildren(FP.errorBox(err.message))
        yes.disabled = false
      }
    })
    document.body.append(dialog)
    dialog.showModal()
    no.focus()
  }

  FP.pages.flags = { id: 'flags', title: 'Flags', render }
  FP.flagRollout = rollout
  FP.confirmDelete = confirmDelete
})()
