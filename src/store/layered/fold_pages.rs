//! A fold's reading of the runs it replaces: neighbouring runs read in pages, front
//! to back.

use std::collections::VecDeque;
use std::ops::Bound;

use super::super::run::{self, Run};
use super::super::PAGE;

/// Runs of neighbouring ranges read in pages, front to back, one after the other.
pub(super) struct RunPages<'a> {
    runs: VecDeque<&'a Run>,
    page: VecDeque<run::Entry>,
    after: Option<Vec<u8>>,
}

impl<'a> RunPages<'a> {
    pub(super) fn new(runs: Vec<&'a Run>) -> RunPages<'a> {
        RunPages {
            runs: runs.into(),
            page: Default::default(),
            after: None,
        }
    }

    /// The next key, reading a page when needed.
    pub(super) fn front(&mut self) -> Option<&[u8]> {
        while self.page.is_empty() {
            let run = *self.runs.front()?;
            let from = match &self.after {
                Some(k) => Bound::Excluded(k.as_slice()),
                None => Bound::Unbounded,
            };
            let page = run.scan(from, Bound::Unbounded, PAGE * 8);
            if page.len() < PAGE * 8 {
                // This run is read through: the next one starts at its own front.
                self.runs.pop_front();
                self.after = None;
            } else {
                self.after = page.last().map(|(k, _)| k.clone());
            }
            self.page.extend(page);
        }
        self.page.front().map(|(k, _)| k.as_slice())
    }

    pub(super) fn take(&mut self) -> run::Entry {
        self.page.pop_front().unwrap_or_default()
    }
}
