//! Refusals a user can see where they work (docs/writes.md#refusals-you-can-read): a write
//! refused at `close()` reaches the writer only as an errno ("Invalid argument"), so the
//! reason is kept beside the file, as its `user.ptefs.error` attribute, and in a read-only
//! `errors` file at the root of a mount that lists the recent refusals with their time, path
//! and reason, newest last.
//!
//! Invariants: memory is bounded whatever is refused: at most [`KEPT`] entries in the log,
//! each reason cut to [`REASON_MAX`] bytes with control characters escaped, and one last
//! reason per file, dropped when the file commits; the `errors` file has an inode number of
//! its own, [`ERRORS_INO`], below every scratch file's and far above every tree node's.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::tree::Ino;

/// The inode number of the `errors` file.
pub const ERRORS_INO: Ino = (1 << 48) - 1;

/// The name of the `errors` file at the root of a mount.
pub const ERRORS_NAME: &str = "errors";

/// How many refusals the `errors` file lists.
pub const KEPT: usize = 100;

/// The longest reason kept, in bytes; longer ones are cut, saying so.
pub const REASON_MAX: usize = 1000;

struct Entry {
    time: SystemTime,
    path: String,
    reason: String,
}

#[derive(Default)]
pub struct Refusals {
    log: Mutex<VecDeque<Entry>>,
    last: Mutex<HashMap<Ino, String>>,
}

/// `reason` on one line, control characters escaped, cut to `REASON_MAX` bytes.
fn one_line(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(REASON_MAX));
    for c in reason.chars() {
        if out.len() >= REASON_MAX {
            out.push_str(" […cut]");
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// `2026-11-27T03:55:12Z`: a time in UTC, to the second.
pub fn utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

impl Refusals {
    fn log(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn last(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, String>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the refusal of a write of the file `ino`, at `path`.
    pub fn record(&self, ino: Ino, path: &str, reason: &str) {
        let reason = one_line(reason);
        self.last().insert(ino, reason.clone());
        let mut log = self.log();
        if log.len() == KEPT {
            log.pop_front();
        }
        log.push_back(Entry {
            time: SystemTime::now(),
            path: one_line(path),
            reason,
        });
    }

    /// Forgets the last refusal of `ino` (it committed since).
    pub fn clear(&self, ino: Ino) {
        self.last().remove(&ino);
    }

    /// The last refusal of `ino` since it last committed.
    pub fn last_of(&self, ino: Ino) -> Option<String> {
        self.last().get(&ino).cloned()
    }

    /// The `errors` file: one line per refusal, `<time>\t<path>\t<reason>`, newest last.
    pub fn text(&self) -> Vec<u8> {
        let mut out = String::new();
        for e in self.log().iter() {
            out.push_str(&utc(e.time));
            out.push('\t');
            out.push_str(&e.path);
            out.push('\t');
            out.push_str(&e.reason);
            out.push('\n');
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_civil_dates_in_utc() {
        let at = |s: u64| utc(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_751_712), "2026-11-27T03:55:12Z");
    }

    #[test]
    fn the_log_is_bounded_and_one_line_per_refusal() {
        let r = Refusals::default();
        for k in 0..KEPT + 5 {
            r.record(
                7,
                "plans/forward/values/0.bin",
                &format!("refusal {k}\nsecond line"),
            );
        }
        let text = String::from_utf8(r.text()).unwrap();
        assert_eq!(text.lines().count(), KEPT);
        assert!(text
            .lines()
            .next()
            .unwrap()
            .ends_with("refusal 5\\nsecond line"));
        assert_eq!(
            r.last_of(7).unwrap(),
            format!("refusal {}\\nsecond line", KEPT + 4)
        );
        r.record(8, "x", &"y".repeat(10 * REASON_MAX));
        assert!(r.last_of(8).unwrap().len() < REASON_MAX + 16);
        r.clear(7);
        assert_eq!(r.last_of(7), None);
    }
}
