//! Edge mode's keys fixed in an event that is already in the stored form, by
//! copying its bytes as sent: runs of the entries that stay are copied whole, the
//! replaced ones left out, and the fixed ones written after them, byte for byte what
//! writing the event from the tape ([`written`](super::written)) gives, at the cost of
//! little more than the copy `encode_event` makes outside edge mode.

use std::ops::Range;

use super::{closing, falsy, Added, Fixer, REPLACED};
use crate::capture::tape::{Object, Value as TapeValue};

/// An event's bytes as sent, already in the stored form: a tape string sits at its
/// address less `origin` in them.
#[derive(Clone, Copy)]
pub(super) struct Sent<'b> {
    pub(super) bytes: &'b [u8],
    pub(super) origin: usize,
}

impl Fixer {
    /// [`written`](super::written) from the event's bytes as sent: each run of kept entries copied
    /// whole, the properties' too. `None` when a key is not where the bytes were
    /// checked to have it.
    pub(super) fn spliced(
        &self,
        out: &mut Vec<u8>,
        o: Object<'_, '_>,
        sent: Sent<'_>,
        keys: &Added<'_>,
    ) -> Option<()> {
        let close = sent.bytes.len().checked_sub(1)?;
        let mut has_properties = false;
        let mut runs = Runs::new(out);
        each_entry(
            o,
            sent,
            close,
            |runs, key, v, entry| {
                if REPLACED.contains(&key) {
                    return runs.flush(sent);
                }
                if key != "properties" {
                    runs.keep(entry);
                    return Some(());
                }
                runs.flush(sent)?;
                // `resolve` refused any other type; null is taken as none.
                let Some(props) = v.as_object() else {
                    return Some(());
                };
                // `"properties":{`, then its entries up to its closing brace.
                let open = entry.start.checked_add(key.len() + 3)?;
                let props_close = entry.end.checked_sub(1)?;
                (sent.bytes.get(open) == Some(&b'{')).then_some(())?;
                runs.emit(sent.bytes.get(entry.start..open)?);
                self.properties(runs.out, props, sent, props_close, keys)?;
                has_properties = true;
                Some(())
            },
            &mut runs,
        )?;
        runs.flush(sent)?;
        if !has_properties {
            runs.emit(br#""properties":{"#);
            runs.out
                .extend_from_slice(&self.tails[usize::from(keys.ip.is_some())]);
        }
        closing(runs.out, keys, false);
        Some(())
    }

    /// The properties object, whose closing brace is at `close`, with the fixed
    /// entries in place of the client's.
    fn properties(
        &self,
        out: &mut Vec<u8>,
        props: Object<'_, '_>,
        sent: Sent<'_>,
        close: usize,
        keys: &Added<'_>,
    ) -> Option<()> {
        let mut add_ip = keys.ip.is_some();
        let mut runs = Runs::new(out);
        each_entry(
            props,
            sent,
            close,
            |runs, key, v, entry| {
                let replaced = match key {
                    "$ignore_sent_at" => true,
                    "$sent_at" => keys.sent_at.is_some(),
                    // A truthy `$ip` of the client's stays; a falsy one gives way.
                    "$ip" if add_ip && !falsy(v) => {
                        add_ip = false;
                        false
                    }
                    "$ip" => add_ip,
                    _ => false,
                };
                match replaced {
                    true => runs.flush(sent),
                    false => {
                        runs.keep(entry);
                        Some(())
                    }
                }
            },
            &mut runs,
        )?;
        runs.flush(sent)?;
        if !runs.first {
            runs.out.push(b',');
        }
        runs.out.extend_from_slice(&self.tails[usize::from(add_ip)]);
        Some(())
    }
}

/// Entries written out in runs: consecutive kept entries are one copy.
struct Runs<'o> {
    out: &'o mut Vec<u8>,
    /// Nothing written yet after the object's opening brace.
    first: bool,
    run: Option<Range<usize>>,
}

impl<'o> Runs<'o> {
    /// Opens the object.
    fn new(out: &'o mut Vec<u8>) -> Runs<'o> {
        out.push(b'{');
        Runs {
            out,
            first: true,
            run: None,
        }
    }

    /// An entry that stays: it joins the run it follows.
    fn keep(&mut self, entry: Range<usize>) {
        self.run = Some(match self.run.take() {
            Some(run) => run.start..entry.end,
            None => entry,
        });
    }

    /// Write the current run, as an entry would be.
    fn flush(&mut self, sent: Sent<'_>) -> Option<()> {
        if let Some(run) = self.run.take() {
            self.emit(sent.bytes.get(run)?);
        }
        Some(())
    }

    /// Write `bytes`, a comma before them unless they come first.
    fn emit(&mut self, bytes: &[u8]) {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        self.out.extend_from_slice(bytes);
    }
}

/// Call `f` with each entry of `o` and where the entry is in the bytes: from its
/// key's opening quote to the comma after its value, or to `close`, the object's
/// closing brace.
fn each_entry<'t, 'a, S>(
    o: Object<'t, 'a>,
    sent: Sent<'_>,
    close: usize,
    mut f: impl FnMut(&mut S, &'a str, TapeValue<'t, 'a>, Range<usize>) -> Option<()>,
    state: &mut S,
) -> Option<()> {
    let at = |s: &str| (s.as_ptr() as usize).checked_sub(sent.origin);
    let mut entries = o.iter().peekable();
    while let Some((key, v)) = entries.next() {
        let start = at(key)?.checked_sub(1)?;
        let end = match entries.peek() {
            Some((next, _)) => at(next)?.checked_sub(2)?,
            None => close,
        };
        if start >= end {
            return None;
        }
        f(state, key, v, start..end)?;
    }
    Some(())
}
