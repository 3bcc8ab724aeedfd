//! Mounting: argument checks before the mount, the background server, clean unmounts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    pub file: PathBuf,
    pub mountpoint: PathBuf,
    /// Attach a .ptd data file (repeatable); its tree appears under data/<stem>/.
    #[arg(long = "data", value_name = "PTD")]
    pub data: Vec<PathBuf>,
    /// Show every file read-only (writes fail with EROFS).
    #[arg(long)]
    pub read_only: bool,
    /// Stay attached and log to stderr.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// FUSE mount options, comma-separated (allow_other, default_permissions, ...).
    #[arg(short = 'o', value_name = "OPT[,OPT]")]
    pub options: Vec<String>,
    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG also works.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// In the background, log to this file instead of syslog.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

pub fn mount(_args: MountArgs) -> ExitCode {
    eprintln!("ptefs: mount is not available in this build");
    ExitCode::FAILURE
}

pub fn umount(_mountpoint: &Path) -> ExitCode {
    eprintln!("ptefs: umount is not available in this build");
    ExitCode::FAILURE
}
