//! The `ptefs` command line: each subcommand parses its arguments and calls the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ptefs::apply::{apply, ApplyRequest};
use ptefs::daemon::{self, MountRequest};
use ptefs::offline;
use ptefs::tree::DEFAULT_MAX_NODES;

/// Help of `--max-nodes`.
const MAX_NODES_HELP: &str =
    "Refuse files whose tree would have more than N nodes (files, directories); default 4000000";

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

#[derive(clap::Args, Debug, Clone)]
struct MountArgs {
    file: PathBuf,
    mountpoint: PathBuf,
    /// Attach a .ptd data file (repeatable); its tree appears under data/<stem>/.
    #[arg(long = "data", value_name = "PTD")]
    data: Vec<PathBuf>,
    /// Show every file read-only (writes fail with EROFS).
    #[arg(long)]
    read_only: bool,
    /// Stay attached and log to stderr.
    #[arg(short = 'f', long)]
    foreground: bool,
    /// FUSE mount options, comma-separated (allow_other, default_permissions, ...).
    #[arg(short = 'o', value_name = "OPT[,OPT]")]
    options: Vec<String>,
    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG also works.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// In the background, log to this file instead of syslog.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    #[arg(long, value_name = "N", help = MAX_NODES_HELP)]
    max_nodes: Option<u64>,
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
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
    },
    /// Write a file of the tree to standard output, without FUSE.
    Cat {
        file: PathBuf,
        path: String,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
    },
    /// One-screen summary: kind, plans, values, tensors by dtype, segments, delegates.
    Info {
        file: PathBuf,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
    },
    /// Update many tensors at once from a safetensors file, without FUSE: every tensor it
    /// names (as the files' weights.safetensors name them) must exist with the same dtype
    /// and shape; the changed ones are written in one journaled commit per file.
    Apply {
        file: PathBuf,
        update: PathBuf,
        /// Attach a .ptd (repeatable): its tensors can be updated too.
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        /// Check the update and say what it would change, writing nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
    },
    /// Deep validation: exit 0 when sound, else each defect on its own line.
    Check {
        file: PathBuf,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
    },
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("ptefs: {message}");
    ExitCode::FAILURE
}

fn exit_code(result: ptefs::error::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli.command {
        Command::Mount(a) => exit_code(daemon::mount(&MountRequest {
            file: a.file,
            mountpoint: a.mountpoint,
            data: a.data,
            read_only: a.read_only,
            foreground: a.foreground,
            options: a.options,
            verbose: a.verbose,
            log_file: a.log_file,
            max_nodes: a.max_nodes,
        })),
        Command::Umount { mountpoint } => exit_code(daemon::umount(&mountpoint)),
        Command::Ls {
            file,
            path,
            long,
            recursive,
            data,
            max_nodes,
        } => exit_code(
            offline::open_fs_limited(&file, &data, max_nodes)
                .and_then(|fs| offline::ls(&fs, &path, long, recursive, &mut out)),
        ),
        Command::Cat {
            file,
            path,
            data,
            max_nodes,
        } => exit_code(
            offline::open_fs_limited(&file, &data, max_nodes)
                .and_then(|fs| offline::cat(&fs, &path, &mut out)),
        ),
        Command::Info {
            file,
            data,
            max_nodes,
        } => exit_code(
            offline::open_fs_limited(&file, &data, max_nodes)
                .and_then(|fs| offline::info(&fs, &mut out)),
        ),
        Command::Apply {
            file,
            update,
            data,
            dry_run,
            max_nodes,
        } => {
            let req = ApplyRequest {
                file,
                data,
                update,
                dry_run,
                max_nodes,
            };
            exit_code(apply(&req, &mut out).map(|_| ()))
        }
        Command::Check {
            file,
            data,
            max_nodes,
        } => {
            let defects = offline::check_limited(&file, &data, max_nodes);
            if defects.is_empty() {
                let _ = writeln!(out, "{}: ok", file.display());
                ExitCode::SUCCESS
            } else {
                for d in &defects {
                    let _ = writeln!(out, "{d}");
                }
                let _ = out.flush();
                fail(format!("{}: {} defect(s)", file.display(), defects.len()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_nodes_help_names_the_default() {
        assert!(MAX_NODES_HELP.ends_with(&format!("default {DEFAULT_MAX_NODES}")));
    }
}
