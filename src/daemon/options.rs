//! FUSE mount options: ptefs's own, then the user's `-o` list (which may override the
//! file-system name and subtype).

use std::path::Path;

use fuser::{Config, MountOption, SessionACL};

/// Worker threads answering the kernel (each with its own `/dev/fuse` descriptor).
const WORKERS: usize = 2;
/// Worker threads of a mount of a remote object: a read waiting on the network holds its
/// thread, and the others go on answering (docs/remote.md#faults).
const REMOTE_WORKERS: usize = 16;

/// The session configuration for `file`, and whether the mount is read-only (`--read-only`
/// or `-o ro`).
/// `remote`: the model's bytes come over the network (more threads wait on it).
pub fn fuse_config(
    options: &[String], read_only: bool, file: &Path, remote: bool,
) -> (Config, bool) {
    let mut read_only = read_only;
    let mut fsname = crate::host::mounts::fsname(file);
    let mut subtype = "ptefs".to_string();
    let mut acl = SessionACL::Owner;
    let mut opts = Vec::new();
    for opt in options.iter().flat_map(|o| o.split(',')) {
        let o = match opt.trim() {
            "" => continue,
            "allow_other" => {
                acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                acl = SessionACL::RootAndOwner;
                continue;
            }
            "ro" => {
                read_only = true;
                continue;
            }
            "rw" => continue,
            // Always on (below).
            "default_permissions" => continue,
            "auto_unmount" => MountOption::AutoUnmount,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            o if o.starts_with("fsname=") => {
                fsname = o["fsname=".len()..].to_string();
                continue;
            }
            o if o.starts_with("subtype=") => {
                subtype = o["subtype=".len()..].to_string();
                continue;
            }
            o => MountOption::CUSTOM(o.to_string()),
        };
        opts.push(o);
    }
    // The kernel checks every request against the modes and owner the tree shows, which
    // never allow more than the model file's own: with allow_other, other users get no
    // more access to the model through the mount than they have to the file.
    opts.push(MountOption::DefaultPermissions);
    opts.push(MountOption::FSName(fsname));
    // Passed as a kernel option, so a direct mount(2) as root carries it too.
    opts.push(MountOption::CUSTOM(format!("subtype={subtype}")));
    opts.push(MountOption::NoAtime);
    if read_only {
        opts.push(MountOption::RO);
    }
    if opts.contains(&MountOption::AutoUnmount) && acl == SessionACL::Owner {
        acl = SessionACL::RootAndOwner;
    }
    let mut cfg = Config::default();
    cfg.mount_options = opts;
    cfg.acl = acl;
    cfg.n_threads = Some(if remote { REMOTE_WORKERS } else { WORKERS });
    cfg.clone_fd = true;
    (cfg, read_only)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mount_options() {
        let options = vec!["allow_other,ro".to_string(), "fsname=x".to_string()];
        let (cfg, ro) = fuse_config(&options, false, Path::new("/m.pte"), false);
        assert!(ro);
        assert_eq!(cfg.acl, SessionACL::All);
        assert!(cfg.mount_options.contains(&MountOption::FSName("x".into())));
        assert!(cfg.mount_options.contains(&MountOption::RO));
        assert!(cfg.mount_options.contains(&MountOption::DefaultPermissions));
        assert!(cfg
            .mount_options
            .contains(&MountOption::CUSTOM("subtype=ptefs".into())));
    }
}
