//! The `replicad replicate` processes of the tests: started with their logs (also as pid 1 in
//! a PID namespace of their own, as in a container), signalled, stopped and waited for with a
//! timeout, and killed when dropped so that a failing test never leaves one behind.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::{WAIT, bin};

/// A running `replicad replicate` process. Killed with SIGKILL when dropped while running,
/// so a failing test never leaves a daemon behind.
pub struct Daemon {
    pub child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

/// Starts `replicad replicate ARGS...`; stdout and stderr go to `<dir>/logs/replicad-N.log`.
pub fn spawn_replicate(dir: &Path, args: &[&str]) -> Daemon {
    spawn_replicate_env(dir, args, &[])
}

/// [`spawn_replicate`] with extra environment variables (test hooks such as
/// `REPLICAD_TEST_NO_INDEX_PROOF`).
pub fn spawn_replicate_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
    let mut cmd = Command::new(bin());
    cmd.arg("replicate").args(args).envs(env.iter().copied());
    spawn_logged(dir, cmd)
}

/// [`spawn_replicate`] in a PID namespace of its own, where the daemon is pid 1 as in a
/// container (root only: see [`can_unshare_pid`]). `unshare --kill-child` takes the daemon
/// down when the [`Daemon`] (unshare) is killed; [`signal_unshared`] reaches the daemon itself.
pub fn spawn_replicate_unshared(dir: &Path, args: &[&str]) -> Daemon {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"])
        .arg(bin())
        .arg("replicate")
        .args(args);
    spawn_logged(dir, cmd)
}

/// Runs `cmd` with stdout and stderr to `<dir>/logs/replicad-N.log`.
pub fn spawn_logged(dir: &Path, mut cmd: Command) -> Daemon {
    let logs = dir.join("logs");
    fs::create_dir_all(&logs).unwrap();
    let n = fs::read_dir(&logs).unwrap().count();
    let log = logs.join(format!("replicad-{n:02}.log"));
    let out = File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = cmd
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn replicad replicate");
    Daemon { child, log }
}

/// Whether this process may make PID namespaces (root). CI runs as root, so there it must.
pub fn can_unshare_pid() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI runs as root and must be able to make a PID namespace"
    );
    eprintln!("SKIPPED: unshare --pid needs root");
    false
}

/// Stops the daemon [`spawn_replicate_unshared`] started with SIGTERM; it must exit 0.
/// Returns its log.
pub fn stop_unshared_ok(mut d: Daemon) -> String {
    signal_unshared(&d, "-TERM");
    let st = wait_timeout(&mut d.child, WAIT).expect("the daemon to stop");
    let log = d.log_text();
    assert_eq!(st.code(), Some(0), "{log}");
    log
}

/// Sends `sig` to the daemon [`spawn_replicate_unshared`] started (unshare's child, whose
/// exit code unshare returns).
pub fn signal_unshared(d: &Daemon, sig: &str) {
    let children =
        fs::read_to_string(format!("/proc/{0}/task/{0}/children", d.child.id())).unwrap();
    let inner = children.split_whitespace().next().expect("unshare's child");
    signal(inner.parse().expect("a pid"), sig);
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill {sig} {pid} failed");
}

/// Sends SIGTERM.
pub fn sigterm(child: &Child) {
    signal(child.id(), "-TERM");
}

/// Sends SIGINT.
pub fn sigint(child: &Child) {
    signal(child.id(), "-INT");
}

/// Sends SIGKILL and reaps the process.
pub fn kill9(child: &mut Child) {
    if child.try_wait().unwrap().is_none() {
        signal(child.id(), "-KILL");
    }
    child.wait().unwrap();
}

/// Waits for the process to exit, at most `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(10));
    }
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for the exit (at most [`WAIT`]); a daemon that does not exit is
    /// killed and the test fails with its log.
    pub fn stop(mut self) -> ExitStatus {
        sigterm(&self.child);
        self.wait_exit("SIGTERM")
    }

    /// Like [`Daemon::stop`] with SIGINT.
    pub fn stop_int(mut self) -> ExitStatus {
        sigint(&self.child);
        self.wait_exit("SIGINT")
    }

    /// [`Daemon::stop`], and the exit code must be 0.
    pub fn stop_ok(self) {
        let log = self.log.clone();
        let st = self.stop();
        assert_eq!(
            st.code(),
            Some(0),
            "replicad replicate exited with {st} after SIGTERM; log:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
    }

    fn wait_exit(&mut self, what: &str) -> ExitStatus {
        match wait_timeout(&mut self.child, WAIT) {
            Some(st) => st,
            None => {
                kill9(&mut self.child);
                panic!(
                    "replicad replicate did not exit within {WAIT:?} of {what}; log:\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// SIGKILL, at whatever point the daemon is.
    pub fn kill9(mut self) {
        kill9(&mut self.child);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-KILL", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
    }
}
