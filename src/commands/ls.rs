//! `ptefs ls`: the tree of a model, as `ls` shows a mount of it.

use std::io::Write;

use super::{find, output};
use crate::error::Result;
use crate::fs::{Attr, FileType, Fs};
use crate::quote;

fn mode_string(a: &Attr) -> String {
    let mut s = String::with_capacity(10);
    s.push(if a.kind == FileType::Directory {
        'd'
    } else {
        '-'
    });
    for shift in [6, 3, 0] {
        let bits = (a.perm >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// One line of a listing. A name with control characters is shown as a JSON string
/// (`quote::listed`), so it can neither break the listing into lines nor drive the terminal.
fn entry_line(name: &str, a: &Attr, long: bool) -> String {
    let shown = if a.kind == FileType::Directory {
        format!("{name}/")
    } else {
        name.to_string()
    };
    let shown = quote::listed(&shown);
    if long {
        format!("{} {:>12} {shown}", mode_string(a), a.size)
    } else {
        shown.into_owned()
    }
}

/// Lists a directory (or names a file), like `ls -1`/`ls -l`; `recursive` lists every path
/// below, one a line, as the fixtures' `.tree` files do.
pub fn ls(fs: &Fs, path: &str, long: bool, recursive: bool, out: &mut dyn Write) -> Result<()> {
    let ino = find(fs, path)?;
    let attr = fs.getattr(ino)?;
    let io = output;
    if attr.kind != FileType::Directory {
        writeln!(out, "{}", entry_line(path.trim_matches('/'), &attr, long)).map_err(io)?;
        return Ok(());
    }
    if recursive {
        let mut stack = vec![(ino, String::new())];
        let mut lines = Vec::new();
        while let Some((dir, prefix)) = stack.pop() {
            for e in fs.list(dir)?.into_iter().skip(2) {
                let rel = format!("{prefix}{}", e.name);
                lines.push(entry_line(&rel, &e.attr, long));
                if e.attr.kind == FileType::Directory {
                    stack.push((e.attr.ino, format!("{rel}/")));
                }
            }
        }
        lines.sort();
        for l in lines {
            writeln!(out, "{l}").map_err(io)?;
        }
    } else {
        for e in fs.list(ino)?.into_iter().skip(2) {
            writeln!(out, "{}", entry_line(&e.name, &e.attr, long)).map_err(io)?;
        }
    }
    Ok(())
}
