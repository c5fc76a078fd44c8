//! Litestream-style command lines: Go's `flag` syntax, rewritten into clap's before parsing.
//!
//! Litestream's flags are Go flags: a long name takes a single dash (`-config FILE`,
//! `-if-db-not-exists`), a value follows as the next argument or after `=` (`-txid=...`), and a
//! boolean may be spelled `-force=true` or `-force=false`. [`normalize`] turns the known
//! multi-letter Litestream names into replicad's `--` forms so that scripts, Dockerfiles and
//! Kubernetes manifests written for Litestream keep working:
//!
//! - `-config`, `-txid`, `-timestamp`, `-exec`, `-replica`, `-parallelism`, `-follow-interval`,
//!   `-log-level` (with a value) and `-if-db-not-exists`, `-if-replica-exists`,
//!   `-no-expand-env`, `-follow`, `-dry-run`, `-json`, `-force` (booleans) become `--NAME`.
//! - A boolean with a Go boolean value (`=true`, `=1`, `=t`, ... / `=false`, `=0`, `=f`, ...)
//!   becomes `--NAME` or is dropped.
//! - `-integrity-check none` becomes `--no-integrity-check`; `quick` and `full` are dropped
//!   (replicad checks the restored database by default). Other values are passed on as
//!   `--integrity-check=VALUE` for clap to reject.
//!
//! What is never rewritten:
//!
//! - single-letter flags (`-o`, `-c`, `-f`, `-h`, `-V`): they are already clap short flags;
//! - values: the argument after an option that takes one (a Litestream name above, or any
//!   option of replicad's own command line, such as `-o` or `--to`) is copied as it is. A value
//!   that starts with `-` (`-o -x.db`, legal in Go) is attached with `=` (`-o=-x.db`) so that
//!   clap reads it as the value rather than as a flag;
//! - anything after `--`;
//! - unknown names: `-frobnicate` reaches clap unchanged, and clap reports it.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};

use clap::CommandFactory;

use super::Cli;

/// Litestream flags that take a value, rewritten from `-NAME` to `--NAME`.
const VALUE_FLAGS: &[&str] = &[
    "config",
    "txid",
    "timestamp",
    "exec",
    "replica",
    "parallelism",
    "follow-interval",
    "log-level",
];

/// Litestream boolean flags, rewritten from `-NAME` to `--NAME`.
const BOOL_FLAGS: &[&str] = &[
    "if-db-not-exists",
    "if-replica-exists",
    "no-expand-env",
    "follow",
    "dry-run",
    "json",
    "force",
];

/// Litestream's `-integrity-check none|quick|full`.
const INTEGRITY_CHECK: &str = "integrity-check";

/// Rewrites a Litestream-style (Go `flag`) command line into one clap parses. `args` is the
/// whole command line, program name first (as `std::env::args_os()` gives it); the program
/// name is kept as it is.
pub fn normalize(args: Vec<OsString>) -> Vec<OsString> {
    let options = OptionsWithValues::of_cli();
    let mut out = Vec::with_capacity(args.len());
    let mut args = args.into_iter();
    if let Some(program) = args.next() {
        out.push(program);
    }
    while let Some(arg) = args.next() {
        // Arguments that are not UTF-8 are never flag names: copy them.
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(args.by_ref());
            break;
        }
        let Some(flag) = Flag::parse(text) else {
            out.push(arg);
            continue;
        };
        if flag.name == INTEGRITY_CHECK {
            let value = match flag.value {
                Some(v) => Some(OsString::from(v)),
                None => args.next(),
            };
            match value.as_deref().and_then(OsStr::to_str) {
                Some("none") => out.push("--no-integrity-check".into()),
                Some("quick" | "full") => {}
                _ => {
                    let mut s = OsString::from("--integrity-check");
                    if let Some(v) = value {
                        s.push("=");
                        s.push(v);
                    }
                    out.push(s);
                }
            }
            continue;
        }
        if BOOL_FLAGS.contains(&flag.name) {
            match flag.value {
                None => out.push(format!("--{}", flag.name).into()),
                Some(v) => match go_bool(v) {
                    Some(true) => out.push(format!("--{}", flag.name).into()),
                    Some(false) => {}
                    // Not a boolean: let clap say so.
                    None => out.push(format!("--{}={v}", flag.name).into()),
                },
            }
            continue;
        }
        let long = VALUE_FLAGS.contains(&flag.name);
        let takes_value = long || options.takes_value(&flag);
        if !takes_value {
            out.push(arg);
            continue;
        }
        // `-config` becomes `--config`; `-o`, `--to` and the like stay as they are.
        let spelled = if long && flag.dashes == 1 {
            format!("--{}", flag.name)
        } else {
            format!("{}{}", "-".repeat(flag.dashes), flag.name)
        };
        match flag.value {
            Some(v) => out.push(format!("{spelled}={v}").into()),
            None => match args.next() {
                // A value that looks like a flag is attached so that clap takes it as the value.
                Some(value) if value.as_encoded_bytes().starts_with(b"-") => {
                    let mut s = OsString::from(format!("{spelled}="));
                    s.push(value);
                    out.push(s);
                }
                Some(value) => {
                    out.push(spelled.into());
                    out.push(value);
                }
                None => out.push(spelled.into()),
            },
        }
    }
    out
}

/// One flag argument: `-name`, `--name`, `-name=value` or `--name=value`.
struct Flag<'a> {
    /// 1 or 2.
    dashes: usize,
    name: &'a str,
    value: Option<&'a str>,
}

impl<'a> Flag<'a> {
    fn parse(arg: &'a str) -> Option<Flag<'a>> {
        let (dashes, rest) = match arg.strip_prefix("--") {
            Some(rest) => (2, rest),
            None => (1, arg.strip_prefix('-')?),
        };
        // `-`, `---x` and `-=x` are not flags Go would accept.
        if rest.is_empty() || rest.starts_with(['-', '=']) {
            return None;
        }
        let (name, value) = match rest.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (rest, None),
        };
        Some(Flag {
            dashes,
            name,
            value,
        })
    }
}

/// Go's `strconv.ParseBool`.
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The options of replicad's own command line (every subcommand) that take a value, so that
/// their values are never rewritten.
struct OptionsWithValues {
    longs: HashSet<String>,
    shorts: HashSet<char>,
}

impl OptionsWithValues {
    fn of_cli() -> OptionsWithValues {
        let mut set = OptionsWithValues {
            longs: HashSet::new(),
            shorts: HashSet::new(),
        };
        set.collect(&Cli::command());
        set
    }

    fn collect(&mut self, cmd: &clap::Command) {
        for arg in cmd.get_arguments() {
            if arg.is_positional() || !arg.get_action().takes_values() {
                continue;
            }
            if let Some(long) = arg.get_long() {
                self.longs.insert(long.to_string());
            }
            if let Some(short) = arg.get_short() {
                self.shorts.insert(short);
            }
        }
        for sub in cmd.get_subcommands() {
            self.collect(sub);
        }
    }

    fn takes_value(&self, flag: &Flag) -> bool {
        if flag.dashes == 2 {
            return self.longs.contains(flag.name);
        }
        // A single-letter short flag (`-o`); `-oVALUE` carries its value already.
        let mut chars = flag.name.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => self.shorts.contains(&c),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Command;

    fn norm(args: &[&str]) -> Vec<String> {
        let mut v = vec![OsString::from("replicad")];
        v.extend(args.iter().map(OsString::from));
        normalize(v)
            .into_iter()
            .skip(1)
            .map(|s| s.into_string().unwrap())
            .collect()
    }

    fn parse(args: &[&str]) -> Cli {
        let mut v = vec![OsString::from("replicad")];
        v.extend(args.iter().map(OsString::from));
        Cli::try_parse_from(normalize(v)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn single_dash_long_flags_become_double_dash() {
        assert_eq!(
            norm(&[
                "restore",
                "-config",
                "/etc/litestream.yml",
                "-if-db-not-exists",
                "-if-replica-exists",
                "-txid",
                "0000000000000003",
                "-parallelism=4",
                "-o",
                "/tmp/x.db",
                "/data/app.db",
            ]),
            [
                "restore",
                "--config",
                "/etc/litestream.yml",
                "--if-db-not-exists",
                "--if-replica-exists",
                "--txid",
                "0000000000000003",
                "--parallelism=4",
                "-o",
                "/tmp/x.db",
                "/data/app.db",
            ]
        );
        assert_eq!(
            norm(&[
                "-log-level",
                "debug",
                "restore",
                "-timestamp",
                "2024-01-01T00:00:00Z",
                "-replica",
                "s3",
                "-no-expand-env",
                "-dry-run",
                "-json",
                "-force",
                "-exec",
                "app serve",
                "-follow",
                "-follow-interval",
                "2s",
            ]),
            [
                "--log-level",
                "debug",
                "restore",
                "--timestamp",
                "2024-01-01T00:00:00Z",
                "--replica",
                "s3",
                "--no-expand-env",
                "--dry-run",
                "--json",
                "--force",
                "--exec",
                "app serve",
                "--follow",
                "--follow-interval",
                "2s",
            ]
        );
    }

    #[test]
    fn double_dash_and_single_letter_flags_are_kept() {
        let args = [
            "restore", "--config", "a.yml", "-c", "b.yml", "-f", "-o", "out.db", "--to", "x.db",
            "-h", "-V", "--json",
        ];
        assert_eq!(norm(&args), args);
    }

    #[test]
    fn values_are_never_rewritten() {
        // Go takes the next argument as the value whatever it looks like; a value that starts
        // with `-` is attached with `=` so that clap does too.
        assert_eq!(
            norm(&["restore", "-o", "-x.db", "-config", "-json", "r"]),
            ["restore", "-o=-x.db", "--config=-json", "r"]
        );
        assert_eq!(
            norm(&["restore", "--to", "-force", "-txid", "-dry-run"]),
            ["restore", "--to=-force", "--txid=-dry-run"]
        );
        assert_eq!(
            norm(&["replicate", "--monitor-interval", "1s", "-json"]),
            ["replicate", "--monitor-interval", "1s", "--json"]
        );
        // `=` values are copied as they are.
        assert_eq!(
            norm(&["restore", "-config=-force", "-o=-json"]),
            ["restore", "--config=-force", "-o=-json"]
        );
        // Positionals and unknown flags are left for clap.
        assert_eq!(
            norm(&["restore", "-frobnicate", "-", "file:///r", "-x"]),
            ["restore", "-frobnicate", "-", "file:///r", "-x"]
        );
        // A value flag at the end stays as it is for clap to report.
        assert_eq!(norm(&["restore", "-txid"]), ["restore", "--txid"]);
    }

    #[test]
    fn nothing_after_double_dash_is_rewritten() {
        assert_eq!(
            norm(&["restore", "-force", "--", "-config", "-json", "--"]),
            ["restore", "--force", "--", "-config", "-json", "--"]
        );
    }

    #[test]
    fn go_boolean_values() {
        assert_eq!(
            norm(&[
                "restore",
                "-force=true",
                "-json=false",
                "--dry-run=1",
                "-follow=F"
            ]),
            ["restore", "--force", "--dry-run"]
        );
        assert_eq!(norm(&["restore", "-json=yes"]), ["restore", "--json=yes"]);
    }

    #[test]
    fn integrity_check_levels() {
        assert_eq!(
            norm(&["restore", "-integrity-check", "none", "r"]),
            ["restore", "--no-integrity-check", "r"]
        );
        assert_eq!(
            norm(&[
                "restore",
                "-integrity-check=quick",
                "-integrity-check",
                "full",
                "r"
            ]),
            ["restore", "r"]
        );
        assert_eq!(
            norm(&["restore", "--integrity-check=none", "r"]),
            ["restore", "--no-integrity-check", "r"]
        );
        assert_eq!(
            norm(&["restore", "-integrity-check", "bogus", "r"]),
            ["restore", "--integrity-check=bogus", "r"]
        );
        assert_eq!(
            norm(&["restore", "-integrity-check"]),
            ["restore", "--integrity-check"]
        );
    }

    #[test]
    fn non_utf8_arguments_are_copied() {
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![b'-', 0xff, b'x']);
        let v = vec![
            OsString::from("replicad"),
            OsString::from("restore"),
            OsString::from("-o"),
            odd.clone(),
            odd.clone(),
        ];
        let mut attached = OsString::from("-o=");
        attached.push(&odd);
        assert_eq!(
            normalize(v),
            [
                OsString::from("replicad"),
                OsString::from("restore"),
                attached,
                odd
            ]
        );
    }

    #[test]
    fn clap_parses_the_result() {
        let cli = parse(&[
            "-log-level",
            "debug",
            "restore",
            "-o",
            "-x.db",
            "-txid",
            "0000000000000003",
            "-if-db-not-exists",
            "-if-replica-exists",
            "-integrity-check",
            "none",
            "-parallelism=8",
            "file:///r",
        ]);
        assert_eq!(cli.log_level, "debug");
        let Command::Restore(a) = cli.command else {
            panic!("not restore")
        };
        assert_eq!(a.to.as_deref(), Some(std::path::Path::new("-x.db")));
        assert_eq!(a.txid.as_deref(), Some("0000000000000003"));
        assert!(a.if_db_not_exists && a.if_replica_exists && a.no_integrity_check);
        assert_eq!(a.parallelism, 8);
        assert_eq!(a.replica, "file:///r");

        let cli = parse(&["restore", "--to", "-y.db", "-config=c.yml", "/data/app.db"]);
        let Command::Restore(a) = cli.command else {
            panic!("not restore")
        };
        assert_eq!(a.to.as_deref(), Some(std::path::Path::new("-y.db")));
        assert_eq!(a.config.as_deref(), Some(std::path::Path::new("c.yml")));

        let cli = parse(&[
            "replicate",
            "-config",
            "/etc/litestream.yml",
            "-no-expand-env",
        ]);
        let Command::Replicate(a) = cli.command else {
            panic!("not replicate")
        };
        assert_eq!(
            a.config.as_deref(),
            Some(std::path::Path::new("/etc/litestream.yml"))
        );
        assert!(a.no_expand_env);

        let cli = parse(&["databases", "-config", "c.yml", "-json"]);
        assert!(matches!(cli.command, Command::Databases(a) if a.json));
    }
}
