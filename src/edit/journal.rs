//! Crash-safe in-place writes: the new bytes go to a checksummed, fsynced journal beside the
//! file, then into the file (fsynced), then the journal is removed. At mount a whole journal
//! is replayed and a torn one discarded, so after a crash at any moment the file ends up
//! entirely old or entirely new.
//!
//! Journal layout: magic `PTEFSJ01`, u64 file size, u64 offset, u64 length, the bytes, and a
//! CRC-32 of everything before it (all little-endian).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"PTEFSJ01";
const HEADER_LEN: usize = 32;

/// `.<name>.ptefs-journal` in the file's directory.
pub fn journal_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.ptefs-journal"))
}

pub fn sync_dir(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("fsync of directory {}", dir.display()), e))
}

fn header(file_len: u64, offset: u64, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&file_len.to_le_bytes());
    h[16..24].copy_from_slice(&offset.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    h
}

/// Replaces `bytes.len()` bytes at `offset` of `path`, which must still be `file_len` long.
/// `exclusive()` is held from the first byte written into the file until it is durable.
pub fn write_in_place<G>(
    path: &Path, file_len: u64, offset: u64, bytes: &[u8], exclusive: impl FnOnce() -> G,
) -> Result<()> {
    let shown = path.display();
    let end = offset
        .checked_add(bytes.len() as u64)
        .filter(|&e| e <= file_len)
        .ok_or_else(|| {
            Error::invalid(format!(
                "write of {} bytes at {offset} reaches past the end of {shown} ({file_len} bytes)",
                bytes.len()
            ))
        })?;
    let target = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("open {shown} for writing"), e))?;
    let now = target
        .metadata()
        .map_err(|e| Error::io(format!("stat {shown}"), e))?
        .len();
    if now != file_len {
        return Err(Error::new(libc::EIO, format!("{shown} changed size behind ptefs (expected {file_len} bytes, found {now}); not writing")));
    }

    let jpath = journal_path(path);
    let h = header(file_len, offset, bytes.len() as u64);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h);
    crc.update(bytes);
    let sum = crc.finalize().to_le_bytes();
    {
        let mut j = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&jpath)
            .map_err(|e| Error::io(format!("create journal {}", jpath.display()), e))?;
        j.write_all(&h)
            .and_then(|_| j.write_all(bytes))
            .and_then(|_| j.write_all(&sum))
            .and_then(|_| j.sync_all())
            .map_err(|e| Error::io(format!("write journal {}", jpath.display()), e))?;
    }
    sync_dir(&jpath)?;

    {
        let _readers_wait = exclusive();
        target
            .write_all_at(bytes, offset)
            .and_then(|_| target.sync_data())
            .map_err(|e| {
                Error::io(
                    format!("write {} bytes at {offset}..{end} of {shown}", bytes.len()),
                    e,
                )
            })?;
    }

    std::fs::remove_file(&jpath)
        .map_err(|e| Error::io(format!("remove journal {}", jpath.display()), e))?;
    Ok(())
}

/// What `recover` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    None,
    Replayed { offset: u64, len: u64 },
    Discarded(String),
}

/// Replays or discards a journal left beside `path` by an interrupted commit.
pub fn recover(path: &Path) -> Result<Recovery> {
    let jpath = journal_path(path);
    let mut j = match File::open(&jpath) {
        Ok(j) => j,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Recovery::None),
        Err(e) => return Err(Error::io(format!("open journal {}", jpath.display()), e)),
    };
    let mut all = Vec::new();
    j.read_to_end(&mut all)
        .map_err(|e| Error::io(format!("read journal {}", jpath.display()), e))?;
    let verdict = parse(&all);
    let outcome = match verdict {
        Err(why) => Recovery::Discarded(why.message().to_string()),
        Ok((file_len, offset, bytes)) => {
            let target = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| Error::io(format!("open {} for writing", path.display()), e))?;
            let now = target
                .metadata()
                .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
                .len();
            if now != file_len {
                Recovery::Discarded(format!(
                    "the journal is for a file of {file_len} bytes but {} has {now}",
                    path.display()
                ))
            } else {
                target
                    .write_all_at(bytes, offset)
                    .and_then(|_| target.sync_data())
                    .map_err(|e| Error::io(format!("replay journal into {}", path.display()), e))?;
                Recovery::Replayed {
                    offset,
                    len: bytes.len() as u64,
                }
            }
        }
    };
    std::fs::remove_file(&jpath)
        .map_err(|e| Error::io(format!("remove journal {}", jpath.display()), e))?;
    sync_dir(&jpath)?;
    Ok(outcome)
}

/// (file size, offset, bytes) of a whole journal, or why it is torn.
fn parse(all: &[u8]) -> Result<(u64, u64, &[u8])> {
    if all.len() < HEADER_LEN + 4 || &all[..8] != MAGIC {
        return Err(Error::invalid(format!(
            "torn journal ({} bytes, no complete header)",
            all.len()
        )));
    }
    let u64_at = |i: usize| u64::from_le_bytes(all[i..i + 8].try_into().expect("8 bytes"));
    let (file_len, offset, len) = (u64_at(8), u64_at(16), u64_at(24));
    let expected = (HEADER_LEN as u64)
        .checked_add(len)
        .and_then(|n| n.checked_add(4));
    if expected != Some(all.len() as u64) {
        return Err(Error::invalid(format!(
            "torn journal: {} bytes, expected {}",
            all.len(),
            HEADER_LEN as u64 + len + 4
        )));
    }
    let body_end = all.len() - 4;
    let sum = u32::from_le_bytes(all[body_end..].try_into().expect("4 bytes"));
    if crc32fast::hash(&all[..body_end]) != sum {
        return Err(Error::invalid("torn journal: checksum mismatch"));
    }
    if offset.checked_add(len).is_none_or(|e| e > file_len) {
        return Err(Error::invalid(format!(
            "journal range {offset}+{len} lies outside a file of {file_len} bytes"
        )));
    }
    Ok((file_len, offset, &all[HEADER_LEN..body_end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pte");
        std::fs::write(&p, content).unwrap();
        (dir, p)
    }

    #[test]
    fn in_place_write_leaves_no_journal() {
        let (_d, p) = temp_file(&[0u8; 100]);
        write_in_place(&p, 100, 10, &[7u8; 5], || ()).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(&got[10..15], &[7u8; 5]);
        assert_eq!(got.len(), 100);
        assert!(!journal_path(&p).exists());
        assert_eq!(recover(&p).unwrap(), Recovery::None);
    }

    #[test]
    fn whole_journal_is_replayed_and_torn_one_discarded() {
        let (_d, p) = temp_file(&[0u8; 64]);
        let h = header(64, 8, 4);
        let mut j = h.to_vec();
        j.extend_from_slice(&[9, 9, 9, 9]);
        let sum = crc32fast::hash(&j);
        j.extend_from_slice(&sum.to_le_bytes());
        for cut in 0..j.len() {
            std::fs::write(journal_path(&p), &j[..cut]).unwrap();
            assert!(
                matches!(recover(&p).unwrap(), Recovery::Discarded(_)),
                "cut {cut}"
            );
            assert_eq!(std::fs::read(&p).unwrap(), vec![0u8; 64]);
        }
        std::fs::write(journal_path(&p), &j).unwrap();
        assert_eq!(
            recover(&p).unwrap(),
            Recovery::Replayed { offset: 8, len: 4 }
        );
        assert_eq!(&std::fs::read(&p).unwrap()[8..12], &[9, 9, 9, 9]);
        assert!(!journal_path(&p).exists());
    }

    #[test]
    fn refuses_when_file_changed_size() {
        let (_d, p) = temp_file(&[0u8; 10]);
        let e = write_in_place(&p, 20, 0, &[1], || ()).unwrap_err();
        assert!(e.message().contains("changed size"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), vec![0u8; 10]);
    }
}
