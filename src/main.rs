//! The `ptefs` command line: each subcommand parses its arguments and calls the library.
//! Shell completions and the man pages are generated from these same definitions
//! (`ptefs completions`, `ptefs man`), so they cannot drift from the parser.
//!
//! Commands that write what they find to standard output (`ls`, `cat`, `info`, `check`,
//! `names`, `recover`, `completions`, `man`) end quietly on a closed pipe, as `cat` does (`ptefs ls
//! … | head`): SIGPIPE ends them. `mount`, `umount` and `apply` keep ignoring it, so a
//! closed pipe never interrupts a daemon or a commit.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use ptefs::commands::{self, apply, ApplyRequest, DiffRequest, MountRequest, NamesRequest};
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

/// How a remote model (an `https://`, `s3://`, `gs://` or `az://` URL) is read.
#[derive(clap::Args, Debug, Clone)]
struct RemoteArgs {
    /// Block cache of remote models on disk [default: $XDG_CACHE_HOME/ptefs, else ~/.cache/ptefs].
    #[arg(long, value_name = "DIR", help_heading = "Remote models")]
    cache_dir: Option<PathBuf>,
    /// Bytes the block cache may hold (suffixes K, M, G; 0: no cache on disk) [default: 4G].
    #[arg(long, value_name = "SIZE", value_parser = commands::mount::parse_size, help_heading = "Remote models")]
    cache_size: Option<u64>,
    /// Seconds a connection or a read may stall before it is retried [default: 30].
    #[arg(long, value_name = "SECONDS", help_heading = "Remote models")]
    timeout: Option<f64>,
    /// Retries of a failed request, with backoff, before a read fails with EIO [default: 3].
    #[arg(long, value_name = "N", help_heading = "Remote models")]
    retries: Option<usize>,
}

impl RemoteArgs {
    /// Makes these the settings of every remote object this process opens.
    fn configure(&self) -> Result<(), String> {
        let mut s = ptefs::source::remote::Settings::default();
        if let Some(d) = &self.cache_dir {
            s.cache_dir =
                Some(std::path::absolute(d).map_err(|e| format!("{}: {e}", d.display()))?);
        }
        if let Some(n) = self.cache_size {
            s.cache_size = n;
        }
        if let Some(t) = self.timeout {
            s.timeout = std::time::Duration::try_from_secs_f64(t)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("--timeout {t}: expected a positive number of seconds"))?;
        }
        if let Some(r) = self.retries {
            s.retries = r;
        }
        ptefs::source::remote::configure(s);
        Ok(())
    }
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
    #[command(flatten)]
    remote: RemoteArgs,
    /// The largest size a named blob, a delegate payload or a scratch file may be given
    /// (bytes, or with K, M, G, T); default: what the file system's free space allows
    #[arg(long, value_name = "SIZE", value_parser = commands::mount::parse_size)]
    max_file_size: Option<u64>,
    /// Show the tensors under the names of a map made by `ptefs names`, or of a checkpoint
    /// learned from at mount: names/ and names.safetensors at the root.
    #[arg(long, value_name = "MAP|CHECKPOINT")]
    names: Option<PathBuf>,
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
        /// Named views, as with `mount --names`.
        #[arg(long, value_name = "MAP|CHECKPOINT")]
        names: Option<PathBuf>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write a file of the tree to standard output, without FUSE.
    Cat {
        file: PathBuf,
        path: String,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
        /// Named views, as with `mount --names`.
        #[arg(long, value_name = "MAP|CHECKPOINT")]
        names: Option<PathBuf>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// One-screen summary: kind, plans, values, tensors by dtype, segments, delegates.
    Info {
        file: PathBuf,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        /// Where the bytes go: by class, file and segment, delegate, dtype and scheme; the
        /// largest tensors, bytes stored more than once, what the program reads of its
        /// data files.
        #[arg(long)]
        sizes: bool,
        /// Print JSON (docs/commands.md#info---json).
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Update many tensors at once from a safetensors file, without FUSE: every tensor it
    /// names (as the files' weights.safetensors name them) must exist with the same dtype
    /// and shape, or be float values of a quantized constant's float32 view; with --names,
    /// tensors named as a checkpoint names them. The changed ones are written in one
    /// journaled commit per file.
    Apply {
        file: PathBuf,
        update: PathBuf,
        /// Attach a .ptd (repeatable): its tensors can be updated too.
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        /// The update's tensors are named as in a checkpoint: a name map (ptefs names -o),
        /// updated with the new digests after the write, or the checkpoint(s) to learn the
        /// names from (repeatable: a base and its adapter).
        #[arg(long = "names", value_name = "MAP|CHECKPOINT")]
        names: Vec<PathBuf>,
        /// Check the update and say what it would change, writing nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Deep validation: exit 0 when sound, else each defect on its own line (and the .ptd
    /// files beside the model that hold keys it lacks).
    Check {
        file: PathBuf,
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        /// Print JSON: every defect with its kind, file and tree path
        /// (docs/commands.md#check---json); the exit status is the same.
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "N", help = MAX_NODES_HELP, default_value_t = DEFAULT_MAX_NODES, hide_default_value = true)]
        max_nodes: u64,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Compare two models (.pte with their .ptd files, or .ptd), or a model and a safetensors
    /// checkpoint, tensor by tensor: identical or changed (bytes that differ, max and mean
    /// absolute difference, cosine similarity and NMSE of the dequantized values), dtype,
    /// shape or scheme changed, only in A, only in B; then methods, operators, delegates and
    /// segment layout. Exit status 0 identical, 1 different, 2 trouble.
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Attach a .ptd to A (repeatable).
        #[arg(long = "data-a", value_name = "PTD")]
        data_a: Vec<PathBuf>,
        /// Attach a .ptd to B (repeatable).
        #[arg(long = "data-b", value_name = "PTD")]
        data_b: Vec<PathBuf>,
        /// Pair tensors by checkpoint name first: the names of a map made by `ptefs names`,
        /// or learned from a checkpoint on each model side.
        #[arg(long, value_name = "MAP|CHECKPOINT")]
        names: Option<PathBuf>,
        /// Print the report as JSON (docs/commands.md#diff---json).
        #[arg(long)]
        json: bool,
    },
    /// Learn the names of the model's tensors from the checkpoint(s) it was exported from,
    /// by content: print which stored tensor each checkpoint tensor is, with its transform
    /// and how clear the match is; -o writes the name map. Exit 1 when nothing matched.
    Names {
        file: PathBuf,
        /// Attach a .ptd (repeatable), as with `mount --data`.
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
        /// A checkpoint: a .safetensors file, a model.safetensors.index.json, a PEFT adapter,
        /// or a directory holding one (repeatable: a base and its adapter).
        #[arg(
            long = "from",
            value_name = "CHECKPOINT",
            required_unless_present = "map"
        )]
        from: Vec<PathBuf>,
        /// Write the name map (JSON) to this file.
        #[arg(short = 'o', value_name = "MAP.json", conflicts_with = "map")]
        output: Option<PathBuf>,
        /// Check a map against the files (their SHA-256 and tensors) and print its report.
        #[arg(long, value_name = "MAP.json", conflicts_with = "from")]
        map: Option<PathBuf>,
    },
    /// Finish or discard the commit a crash interrupted, without FUSE: a whole journal is
    /// replayed, a torn one discarded (saying why), any other refused and left in place.
    /// Refused while the file is mounted.
    Recover {
        file: PathBuf,
        /// Also recover this .ptd (repeatable).
        #[arg(long = "data", value_name = "PTD")]
        data: Vec<PathBuf>,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page of ptefs, or of one of its commands, in roff (`ptefs man | man -l -`).
    Man {
        /// The command whose page to print (ptefs-mount(1), …); the overview without it.
        command: Option<String>,
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

/// SIGPIPE ends the process, without a message, as it ends `cat`.
fn die_on_closed_pipe() {
    // SAFETY: restores the default disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// The roff man page of `ptefs` (`None`) or of `ptefs <command>`.
fn man_page(command: Option<&str>, out: &mut dyn Write) -> Result<(), String> {
    // `help` is clap's, with no page of its own: the pages do not name it.
    let top = Cli::command().disable_help_subcommand(true);
    let cmd = match command {
        None => top,
        Some(name) => {
            let names: Vec<&str> = top.get_subcommands().map(|c| c.get_name()).collect();
            let sub = top.find_subcommand(name).ok_or_else(|| {
                format!("no command {name:?}: expected one of {}", names.join(", "))
            })?;
            sub.clone()
                .name(format!("ptefs-{name}"))
                .bin_name(format!("ptefs {name}"))
                .version(env!("CARGO_PKG_VERSION"))
        }
    };
    clap_mangen::Man::new(cmd)
        .render(out)
        .map_err(|e| format!("standard output: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Mount(_) | Command::Umount { .. } | Command::Apply { .. }
    ) {
        die_on_closed_pipe();
    }
    let remote = match &cli.command {
        Command::Mount(MountArgs { remote, .. })
        | Command::Ls { remote, .. }
        | Command::Cat { remote, .. }
        | Command::Info { remote, .. }
        | Command::Check { remote, .. } => Some(remote),
        _ => None,
    };
    if let Some(Err(e)) = remote.map(RemoteArgs::configure) {
        return fail(e);
    }
    let code = run(cli.command);
    // Blocks of remote models fetched last reach the cache before the process ends.
    ptefs::source::remote::flush();
    code
}

fn run(command: Command) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match command {
        Command::Mount(a) => exit_code(commands::mount(&MountRequest {
            file: a.file,
            mountpoint: a.mountpoint,
            data: a.data,
            read_only: a.read_only,
            foreground: a.foreground,
            options: a.options,
            verbose: a.verbose,
            log_file: a.log_file,
            max_nodes: a.max_nodes,
            max_file_size: a.max_file_size,
            names: a.names,
        })),
        Command::Umount { mountpoint } => exit_code(commands::umount(&mountpoint)),
        Command::Ls {
            file,
            path,
            long,
            recursive,
            data,
            max_nodes,
            names,
            ..
        } => exit_code(
            commands::open_fs_named(&file, &data, max_nodes, names.as_deref())
                .and_then(|fs| commands::ls(&fs, &path, long, recursive, &mut out)),
        ),
        Command::Cat {
            file,
            path,
            data,
            max_nodes,
            names,
            ..
        } => exit_code(
            commands::open_fs_named(&file, &data, max_nodes, names.as_deref())
                .and_then(|fs| commands::cat(&fs, &path, &mut out)),
        ),
        Command::Info {
            file,
            data,
            sizes,
            json,
            max_nodes,
            ..
        } => exit_code(
            commands::open_catalog_limited(&file, &data, max_nodes).and_then(|c| {
                commands::info::info_as(&c, commands::info::InfoFormat { sizes, json }, &mut out)
            }),
        ),
        Command::Apply {
            file,
            update,
            data,
            names,
            dry_run,
        } => {
            let req = ApplyRequest {
                file,
                data,
                update,
                names,
                dry_run,
            };
            exit_code(apply(&req, &mut out).map(|_| ()))
        }
        Command::Check {
            file,
            data,
            json,
            max_nodes,
            ..
        } => {
            let report = commands::check_report(&file, &data, max_nodes);
            if json {
                let text = serde_json::to_string_pretty(&report.json(&file))
                    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
                return if report.defects.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    fail(format!(
                        "{}: {} defect(s)",
                        file.display(),
                        report.defects.len()
                    ))
                };
            }
            let lines = report.defects.iter().map(|d| &d.message);
            for line in lines.chain(&report.advice) {
                let _ = writeln!(out, "{line}");
            }
            // A URL is shown without its secrets.
            let file = match file
                .to_str()
                .filter(|f| ptefs::source::remote::is_remote(f))
            {
                Some(url) => PathBuf::from(ptefs::source::remote::shown(url)),
                None => file,
            };
            if report.defects.is_empty() {
                let _ = writeln!(out, "{}: ok", file.display());
                ExitCode::SUCCESS
            } else {
                let _ = out.flush();
                fail(format!(
                    "{}: {} defect(s)",
                    file.display(),
                    report.defects.len()
                ))
            }
        }
        Command::Diff {
            a,
            b,
            data_a,
            data_b,
            names,
            json,
        } => {
            let req = DiffRequest {
                compare: ptefs::compare::Request {
                    a,
                    b,
                    data_a,
                    data_b,
                    names,
                },
                json,
            };
            match commands::diff(&req, &mut out) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    let _ = out.flush();
                    eprintln!("ptefs: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Names {
            file,
            data,
            from,
            output,
            map,
        } => {
            let req = NamesRequest {
                file,
                data,
                from,
                output,
                map,
            };
            exit_code(commands::names(&req, &mut out).map(|_| ()))
        }
        Command::Recover { file, data } => exit_code(commands::recover(&file, &data, &mut out)),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ptefs", &mut out);
            ExitCode::SUCCESS
        }
        Command::Man { command } => match man_page(command.as_deref(), &mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
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
