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
    /// [`written`](super::written) from the event's bytes as sent: the runs of kept
    /// entries between the replaced ones copied whole, the properties' too. `None`
    /// when a key is not where the bytes were checked to have it.
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
        let cut = |key: &str, _: TapeValue<'_, '_>| key == "properties" || REPLACED.contains(&key);
        let mut replace =
            |runs: &mut Runs<'_>, key: &str, v: TapeValue<'_, '_>, entry: Range<usize>| {
                // `resolve` refused any other type than an object; null is taken as none.
                let (true, Some(props)) = (key == "properties", v.as_object()) else {
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
            };
        cut_out(o, sent, close, &mut runs, cut, &mut replace)?;
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
        let cut = |key: &str, v: TapeValue<'_, '_>| match key {
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
        cut_out(props, sent, close, &mut runs, cut, &mut |_, _, _, _| {
            Some(())
        })?;
        if !runs.first {
            runs.out.push(b',');
        }
        runs.out.extend_from_slice(&self.tails[usize::from(add_ip)]);
        Some(())
    }
}

/// Entries written one after another, commas between them.
struct Runs<'o> {
    out: &'o mut Vec<u8>,
    /// Nothing written yet after the object's opening brace.
    first: bool,
}

impl<'o> Runs<'o> {
    /// Opens the object.
    fn new(out: &'o mut Vec<u8>) -> Runs<'o> {
        out.push(b'{');
        Runs { out, first: true }
    }

    /// Write `bytes`, one or more entries, a comma before them unless they come
    /// first.
    fn emit(&mut self, bytes: &[u8]) {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        self.out.extend_from_slice(bytes);
    }
}

/// Copy the entries of `o` (whose closing brace is at `close`) into `runs`, but for
/// those `cut` picks, which are handed to `replace` with where they are in the bytes
/// (from the key's opening quote to the comma after the value, or to `close`), in
/// their place. An entry kept costs a look at its key: the bytes between two cut
/// entries are copied at once.
fn cut_out<'t, 'a>(
    o: Object<'t, 'a>,
    sent: Sent<'_>,
    close: usize,
    runs: &mut Runs<'_>,
    mut cut: impl FnMut(&'a str, TapeValue<'t, 'a>) -> bool,
    replace: &mut impl FnMut(&mut Runs<'_>, &'a str, TapeValue<'t, 'a>, Range<usize>) -> Option<()>,
) -> Option<()> {
    let at = |s: &str| (s.as_ptr() as usize).checked_sub(sent.origin);
    // The first byte not yet copied, and the entry cut last, whose end is the comma
    // before the next key.
    let mut copied: Option<usize> = None;
    let mut pending: Option<(&'a str, TapeValue<'t, 'a>, usize)> = None;
    let mut end_of = |runs: &mut Runs<'_>,
                      copied: &mut Option<usize>,
                      pending: (&'a str, TapeValue<'t, 'a>, usize),
                      end: usize| {
        let (key, v, start) = pending;
        if let Some(from) = copied.take() {
            // The kept entries before it, without the comma that follows them.
            runs.emit(sent.bytes.get(from..start.checked_sub(1)?)?);
        }
        if start >= end {
            return None;
        }
        replace(runs, key, v, start..end)?;
        Some(())
    };
    for (key, v) in o.iter() {
        let start = at(key)?.checked_sub(1)?;
        if let Some(p) = pending.take() {
            end_of(runs, &mut copied, p, start.checked_sub(1)?)?;
        }
        if cut(key, v) {
            pending = Some((key, v, start));
        } else if copied.is_none() {
            copied = Some(start);
        }
    }
    if let Some(p) = pending.take() {
        end_of(runs, &mut copied, p, close)?;
    }
    if let Some(from) = copied {
        runs.emit(sent.bytes.get(from..close)?);
    }
    Some(())
}
