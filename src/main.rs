//! The `ptefs` command line: each subcommand parses its arguments and calls the core.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ptefs::daemon::{self, MountArgs};
use ptefs::offline;

#[derive(Parser)]
#[command(
    name = "ptefs",
    version,
    about = "Mount ExecuTorch .pte/.ptd files as a directory tree; read and swap tensors in place"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount FILE on MOUNTPOINT; returns once the mount is live, then serves in the background.
    Mount(MountArgs),
    /// Unmount a ptefs mount, after its pending commits finish.
    Umount { mountpoint: PathBuf },
    /// List a directory of the tree, without FUSE.
    Ls {
        file: PathBuf,
        #[arg(default_value = "")]
        path: String,
        /// Long listing: mode, size, name.
        #[arg(short = 'l')]
        long: bool,
        /// Every path below PATH, one a line.
        #[arg(short = 'R')]
        recursive: bool,
        /// Attach a .ptd (repeatable), as with `mount --data`.
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
    },
    /// Write a file of the tree to standard output, without FUSE.
    Cat {
        file: PathBuf,
        path: String,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
    },
    /// One-screen summary: kind, plans, values, tensors by dtype, segments, delegates.
    Info {
        file: PathBuf,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
    },
    /// Deep validation: exit 0 when sound, else each defect on its own line.
    Check {
        file: PathBuf,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
    },
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("ptefs: {message}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli.command {
        Command::Mount(args) => daemon::mount(args),
        Command::Umount { mountpoint } => daemon::umount(&mountpoint),
        Command::Ls {
            file,
            path,
            long,
            recursive,
            data,
        } => {
            let fs = match offline::open_fs(&file, &data) {
                Ok(fs) => fs,
                Err(e) => return fail(e),
            };
            match offline::ls(&fs, &path, long, recursive, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Cat { file, path, data } => {
            let fs = match offline::open_fs(&file, &data) {
                Ok(fs) => fs,
                Err(e) => return fail(e),
            };
            match offline::cat(&fs, &path, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Info { file, data } => {
            let fs = match offline::open_fs(&file, &data) {
                Ok(fs) => fs,
                Err(e) => return fail(e),
            };
            match offline::info(&fs, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Check { file, data } => {
            let defects = offline::check(&file, &data);
            if defects.is_empty() {
                let _ = writeln!(out, "{}: ok", file.display());
                ExitCode::SUCCESS
            } else {
                for d in &defects {
                    let _ = writeln!(out, "{d}");
                }
                let _ = out.flush();
                eprintln!("ptefs: {}: {} defect(s)", file.display(), defects.len());
                ExitCode::FAILURE
            }
        }
    }
}
