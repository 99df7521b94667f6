//! Checking a stopped log's files for `flagpost check --db`: every segment read over
//! damage, the numbers checked across segments against the recorded skips and the
//! clean stop's end, without changing anything on disk (spares are left, no record is
//! removed). Problems are losses of entries the compactor has not applied yet; damage
//! below the checkpoint is only noted, as its events are already stored.

use std::fs::File;
use std::io;
use std::path::Path;

use super::marks::{covering, load_skipped, read_clean, uncovered};
use super::segment::{next_intact, read_frame, segment_first, segment_path, Frame, HEADER};

/// What the check found: notes for the operator, problems that lose events.
#[derive(Debug, Default)]
pub struct Report {
    pub notes: Vec<String>,
    pub problems: Vec<String>,
}

/// Check the log in `dir`; `checkpoint` is the last entry the compactor applied.
pub fn check(dir: &Path, checkpoint: Option<u64>) -> io::Result<Report> {
    let mut report = Report::default();
    let mut firsts = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if let Some(first) = segment_first(&entry?.file_name().to_string_lossy()) {
            firsts.push(first);
        }
    }
    firsts.sort_unstable();
    let skipped = load_skipped(dir)?;
    let clean = read_clean(dir)?;
    let applied = checkpoint.map_or(0, |c| c.saturating_add(1));
    let lose = |report: &mut Report, from: u64, to: u64, what: &str| {
        for (a, b) in uncovered(&skipped, from.max(applied), to) {
            report.problems.push(format!(
                "log entries {a} to {} ({} entries): {what}",
                b - 1,
                b - a
            ));
        }
    };
    if let (Some(&oldest), Some(_)) = (firsts.first(), checkpoint) {
        lose(
            &mut report,
            applied,
            oldest,
            "missing before the oldest segment",
        );
    }
    let mut end = None;
    for (i, &first) in firsts.iter().enumerate() {
        let following = firsts.get(i + 1).copied();
        let walked = walk(dir, first, following, &skipped)?;
        for (a, b) in walked.damaged {
            let text = format!("damaged (segment {first}); the compactor quarantines them");
            match b > applied {
                true => lose(&mut report, a, b, &text),
                false => report.notes.push(format!(
                    "log entries {a} to {} damaged, already applied",
                    b - 1
                )),
            }
        }
        if let Some(bad) = walked.bad_tail {
            match (following, clean) {
                (None, Some(c)) if bad >= c => report.notes.push(format!(
                    "log entry {bad} at the end of the newest segment is a write cut short after the clean stop: never acknowledged"
                )),
                (None, None) => report.notes.push(format!(
                    "log entry {bad} at the end of the newest segment does not check out: the write in progress at an unclean stop"
                )),
                _ => {}
            }
        }
        if let Some(next) = following {
            let text = format!("missing between segment {first} and segment {next}");
            lose(&mut report, walked.next, next, &text);
        }
        if walked.next > first {
            end = Some(walked.next);
        }
    }
    if let (Some(c), Some(e)) = (clean, end.or(Some(0))) {
        lose(
            &mut report,
            e,
            c,
            "missing at the end: a segment deleted or cut short after the clean stop",
        );
    }
    report.notes.push(format!(
        "log: {} segment(s), entries up to {}, compactor checkpoint {}",
        firsts.len(),
        end.map_or("none".to_string(), |e| e.saturating_sub(1).to_string()),
        checkpoint.map_or("none".to_string(), |c| c.to_string()),
    ));
    Ok(report)
}

struct Walked {
    next: u64,
    damaged: Vec<(u64, u64)>,
    bad_tail: Option<u64>,
}

/// Read one segment as the compactor would: past damage to the next intact entry,
/// stopping at numbers recorded as skipped or at the next segment's first.
fn walk(
    dir: &Path,
    first: u64,
    following: Option<u64>,
    skipped: &[(u64, u64)],
) -> io::Result<Walked> {
    let file = File::open(segment_path(dir, first))?;
    let len = file.metadata()?.len();
    let limit = following.unwrap_or(u64::MAX);
    let mut walked = Walked {
        next: first,
        damaged: Vec::new(),
        bad_tail: None,
    };
    let mut offset = 0u64;
    while walked.next < limit {
        let seq = walked.next;
        let damaged = match read_frame(&file, offset, len, seq)? {
            Frame::Entry(payload) => {
                offset += (HEADER + payload.len()) as u64;
                walked.next += 1;
                continue;
            }
            Frame::End => false,
            Frame::Damaged(_) => true,
        };
        if covering(skipped, seq).is_some() {
            break;
        }
        match next_intact(&file, offset + 1, len, seq + 1, limit)? {
            Some((at, found)) => {
                walked.damaged.push((seq, found));
                offset = at;
                walked.next = found;
            }
            None => {
                if damaged {
                    walked.bad_tail = Some(seq);
                    if following.is_some() {
                        walked.damaged.push((seq, seq + 1));
                        walked.next = seq + 1;
                    }
                }
                break;
            }
        }
    }
    Ok(walked)
}
