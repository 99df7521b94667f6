//! The installed unit's view of the machine without systemd as PID 1: its `ExecStart=`
//! run as its `User=`, with its `UMask=`, `Environment=` and `EnvironmentFile=`, in a
//! mount namespace where everything is read-only (`ProtectSystem=strict`) but its state
//! directory and `ReadWritePaths=`, with a private `/tmp` (`PrivateTmp=`), and in a
//! network namespace of its own so the unit's fixed port cannot meet another server.
//! Requests reach it from a thread that joins that network namespace.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::*;

/// The `[Service]` settings of a unit file that the sandbox reproduces.
#[derive(Clone)]
pub struct Unit {
    pub exec_start: Vec<String>,
    pub user: String,
    pub umask: String,
    pub environment: Vec<(String, String)>,
    pub environment_files: Vec<String>,
    /// The state directory and the `ReadWritePaths=` that exist (a `-` path may not).
    pub writable: Vec<String>,
    pub listen: SocketAddr,
}

impl Unit {
    pub fn read(path: &Path) -> Unit {
        let text = std::fs::read_to_string(path).expect("the installed unit");
        let values = |key: &str| -> Vec<String> {
            text.lines()
                .skip_while(|l| *l != "[Service]")
                .take_while(|l| !l.starts_with("[Install]"))
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
                .collect()
        };
        let one = |key: &str| -> String {
            let v = values(key);
            assert_eq!(v.len(), 1, "{key}= in {}: {v:?}", path.display());
            v[0].clone()
        };
        assert_eq!(one("ProtectSystem"), "strict");
        assert_eq!(one("PrivateTmp"), "yes");
        let exec_start: Vec<String> = one("ExecStart")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let listen = exec_start
            .windows(2)
            .find(|w| w[0] == "--listen")
            .map(|w| w[1].parse().expect("--listen ADDR"))
            .expect("ExecStart= gives --listen");
        let mut writable = vec![format!("/var/lib/{}", one("StateDirectory"))];
        for path in values("ReadWritePaths")
            .iter()
            .flat_map(|v| v.split_whitespace())
        {
            match path.strip_prefix('-') {
                Some(p) if !Path::new(p).exists() => {}
                Some(p) => writable.push(p.to_owned()),
                None => writable.push(path.to_owned()),
            }
        }
        let environment = values("Environment")
            .iter()
            .map(|v| {
                let (k, v) = v.split_once('=').expect("Environment=KEY=VALUE");
                (k.to_owned(), v.to_owned())
            })
            .collect();
        Unit {
            exec_start,
            user: one("User"),
            umask: one("UMask"),
            environment,
            environment_files: values("EnvironmentFile"),
            writable,
            listen,
        }
    }

    /// `Environment=`, then each `EnvironmentFile=` (which win, as systemd reads them).
    fn env(&self) -> Vec<(String, String)> {
        let mut env = self.environment.clone();
        for file in &self.environment_files {
            let (optional, file) = match file.strip_prefix('-') {
                Some(f) => (true, f),
                None => (false, file.as_str()),
            };
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(_) if optional => continue,
                Err(e) => panic!("EnvironmentFile={file}: {e}"),
            };
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (k, v) = line.split_once('=').expect("KEY=VALUE");
                env.retain(|(old, _)| old != k);
                env.push((k.to_owned(), v.to_owned()));
            }
        }
        env
    }

    /// The shell run inside the new namespaces before it becomes the service.
    fn script(&self) -> String {
        let mut s = String::from("set -e\nip link set lo up\n");
        for dir in &self.writable {
            s += &format!("mount --bind '{dir}' '{dir}'\n");
        }
        // Every other mount read-only; /proc, /sys and /dev keep theirs, as with
        // ProtectSystem=strict.
        s += "awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do\n";
        s += "  case \"$m\" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac\n";
        for dir in &self.writable {
            s += &format!("  [ \"$m\" = '{dir}' ] && continue\n");
        }
        s += "  mount -o remount,bind,ro \"$m\"\ndone\n";
        s += "mount -t tmpfs -o mode=1777 tmpfs /tmp\nmount -t tmpfs -o mode=1777 tmpfs /var/tmp\n";
        s += &format!("umask {}\ncd /\n", self.umask);
        s += &format!(
            "exec setpriv --reuid '{0}' --regid '{0}' --init-groups --no-new-privs -- \"$@\"\n",
            self.user
        );
        s
    }
}

/// The service, running as the unit would run it.
pub struct Service {
    child: Option<Child>,
    pub log: Arc<Mutex<String>>,
    pub addr: SocketAddr,
}

impl Service {
    pub fn start(unit: &Unit) -> Service {
        let mut cmd = Command::new(ops_tool("unshare"));
        cmd.args(["--mount", "--net", "--propagation", "private", "--"])
            .args(["/bin/sh", "-c", &unit.script(), "flagpost-sandbox"])
            .args(&unit.exec_start)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .envs(unit.env())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the sandbox");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on ") {
                    let _ = tx.send(());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let service = Service {
            child: Some(child),
            log,
            addr: unit.listen,
        };
        if rx.recv_timeout(WAIT).is_err() {
            panic!("the service did not start:\n{}", service.log());
        }
        service
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// A request from inside the service's network namespace.
    pub fn send(&self, req: Req) -> Resp {
        let (pid, addr) = (self.pid(), self.addr);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("its namespace");
            // SAFETY: setns on this thread only, with a namespace descriptor just opened.
            let joined = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(joined, 0, "setns: {}", std::io::Error::last_os_error());
            send(addr, req)
        })
        .join()
        .expect("the request's thread")
    }

    /// A shell command in the service's mount namespace, as root.
    pub fn inside(&self, script: &str) -> std::process::Output {
        Command::new(ops_tool("nsenter"))
            .args([
                "-t",
                &self.pid().to_string(),
                "-m",
                "--",
                "/bin/sh",
                "-c",
                script,
            ])
            .output()
            .expect("nsenter")
    }

    /// SIGTERM, as `systemctl stop` sends it; the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own child, which has not been waited for.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the service did not stop on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn ops_tool(name: &str) -> std::path::PathBuf {
    crate::ops::tool(name)
}
