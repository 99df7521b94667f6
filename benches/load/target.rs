//! The servers under load as child processes: start one, learn its address from the
//! `listening on <addr>` line on its stderr, read its peak memory, stop it with SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A release build opens sled and binds within a second; this is for a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// flagpost finishes in-flight requests and flushes on SIGTERM; nothing is in flight here.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often to look whether a stopping child has exited.
const STOP_POLL: Duration = Duration::from_millis(20);
/// The line both servers print once they accept connections.
const LISTENING: &str = "listening on ";

/// Command-line options and environment added to a flagpost's `serve`.
#[derive(Default, Clone)]
pub struct Options {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// A running server process, killed on drop if it was not stopped.
pub struct Target {
    name: &'static str,
    pub addr: SocketAddr,
    child: Option<Child>,
}

impl Target {
    /// The release `flagpost` binary on a fresh port.
    pub fn flagpost(data_dir: &Path, db_dir: &Path) -> Result<Target, String> {
        Target::flagpost_at(
            "flagpost",
            Path::new(env!("CARGO_BIN_EXE_flagpost")),
            data_dir,
            db_dir,
        )
    }

    /// Another flagpost build (an earlier commit), measured beside this one.
    pub fn flagpost_at(
        name: &'static str,
        binary: &Path,
        data_dir: &Path,
        db_dir: &Path,
    ) -> Result<Target, String> {
        Target::flagpost_with(name, binary, data_dir, db_dir, &Options::default())
    }

    /// A flagpost build with further options and environment (the sink's, say).
    pub fn flagpost_with(
        name: &'static str,
        binary: &Path,
        data_dir: &Path,
        db_dir: &Path,
        options: &Options,
    ) -> Result<Target, String> {
        Target::flagpost_on(name, binary, data_dir, db_dir, "127.0.0.1:0", options)
    }

    /// [`Target::flagpost_with`] listening on `listen`, say an address a client was
    /// given before the server started.
    pub fn flagpost_on(
        name: &'static str,
        binary: &Path,
        data_dir: &Path,
        db_dir: &Path,
        listen: &str,
        options: &Options,
    ) -> Result<Target, String> {
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .args(["--listen", listen])
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--db")
            .arg(db_dir)
            // `FLAGPOST_BENCH_LOG` sets the server's log filter for a run that wants more
            // (e.g. `info,flagpost::compactor::phases=debug` for the compactor's phases).
            .env("FLAGPOST_LOG", bench_log())
            // The address is parsed from the log line; colour codes would only get in the way.
            .env("NO_COLOR", "1")
            .args(&options.args)
            .envs(options.env.iter().map(|(k, v)| (k, v)));
        Target::spawn(name, command)
    }

    /// This harness binary again, serving as the reference in its own process.
    pub fn reference() -> Result<Target, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the harness: {e}"))?;
        let mut command = Command::new(exe);
        command.arg("--reference-server");
        Target::spawn("reference", command)
    }

    fn spawn(name: &'static str, mut command: Command) -> Result<Target, String> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel();
        // Keep draining stderr for the whole run: a full pipe would block the server's
        // logging and so the server. Lines after the address are passed on to ours.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                match (line.find(LISTENING), &tx) {
                    (Some(at), Some(sender)) => {
                        let _ = sender.send(address(&line[at + LISTENING.len()..]));
                        tx = None;
                    }
                    _ => eprintln!("[{name}] {line}"),
                }
            }
        });
        let mut target = Target {
            name,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child: Some(child),
        };
        target.addr = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Some(addr)) => addr,
            Ok(None) => return Err(format!("{name} printed an address that does not parse")),
            Err(_) => return Err(format!("{name} did not start listening (its log is above)")),
        };
        Ok(target)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("still running").id()
    }

    /// Peak resident set size (`VmHWM`) in KiB, if the kernel reports it.
    pub fn peak_rss(&self) -> Option<u64> {
        status_kib(self.pid(), "VmHWM").ok()
    }

    /// SIGKILL, as a crash would: nothing is flushed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(&mut self) -> Result<(), String> {
        let name = self.name;
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if !sent.success() {
            return Err(format!("kill -TERM {name} failed"));
        }
        let mut child = self.child.take().expect("still running");
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("{name} exited with {status}")),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(STOP_POLL),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{name} did not stop within {STOP_TIMEOUT:?} of SIGTERM"
                    ));
                }
                Err(e) => return Err(format!("cannot wait for {name}: {e}")),
            }
        }
    }
}

impl Drop for Target {
    /// An early error must not leave servers running behind the harness.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A KiB figure of a process's `/proc/<pid>/status`, such as `VmRSS` or `VmHWM`.
pub fn status_kib(pid: u32, field: &str) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read /proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))
}

/// CPU seconds (user and system) a thread of `pid` named `name` has used, for the
/// share of a server's time one thread (the compactor) takes.
pub fn thread_cpu_seconds(pid: u32, name: &str) -> Result<f64, String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("cannot list /proc/{pid}/task: {e}"))?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat"))
            .map_err(|e| format!("cannot read a thread's stat: {e}"))?;
        // Fields after the name, which ends at the last ')': utime and stime are the
        // 14th and 15th of the line, the 12th and 13th after it.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let used = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        return match (used(11), used(12)) {
            (Some(user), Some(system)) => Ok((user + system) / ticks),
            _ => Err(format!("cannot read the CPU time of {name}")),
        };
    }
    Err(format!("no thread named {name} in {pid}"))
}

/// The address at the start of `rest`, ending at whitespace or a terminal escape.
fn address(rest: &str) -> Option<SocketAddr> {
    rest.split(|c: char| c.is_whitespace() || c == '\x1b')
        .next()?
        .parse()
        .ok()
}

/// The served binary's log filter: `info` unless `FLAGPOST_BENCH_LOG` says otherwise.
fn bench_log() -> String {
    std::env::var("FLAGPOST_BENCH_LOG").unwrap_or_else(|_| "info".to_owned())
}
