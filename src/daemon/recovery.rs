//! Finishing interrupted commits before a mount: journals are replayed or discarded, and
//! files left by an interrupted re-layout are removed. Each action is logged and, when the
//! daemon will leave the terminal, printed.

use std::path::Path;

use crate::edit::{journal, relayout};
use crate::error::Result;

pub fn recover(path: &Path, announce: bool) -> Result<()> {
    let say = |msg: String| {
        log::warn!("{msg}");
        if announce {
            eprintln!("ptefs: {msg}");
        }
    };
    match journal::recover(path)
        .map_err(|e| e.context(format!("{}: journal recovery failed", path.display())))?
    {
        journal::Recovery::None => {}
        journal::Recovery::Replayed { ranges, bytes } => say(format!(
            "{}: finished an interrupted commit from its journal ({bytes} bytes in {ranges} range(s))",
            path.display()
        )),
        journal::Recovery::Discarded(why) => say(format!(
            "{}: discarded the journal of an interrupted commit ({why}); the file is unchanged",
            path.display()
        )),
    }
    for message in relayout::remove_stale(path) {
        say(message);
    }
    Ok(())
}
