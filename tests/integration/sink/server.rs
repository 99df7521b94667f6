//! A real `clickhouse-server` for the sink's tests: started as a plain process on a
//! free loopback port, with its config, users, data, temporary files and logs in a
//! temporary directory, stopped by pid when the handle drops. Each test gets its own
//! server and a freshly created database, so tests never see each other's rows.
//!
//! The binary is Debian's package (`.ci/run` installs it); `CLICKHOUSE_SERVER` names
//! another. Every test that needs it is `#[ignore]`d with that reason, so a plain
//! `cargo test` lists it as ignored; run (`cargo test -- --include-ignored`, what
//! `.ci/run` runs) without the server, it fails and says what is missing.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{try_send, Req, Resp};

/// Where Debian's `clickhouse-server` package puts the server (18.16 ships a
/// stand-alone `clickhouse-server`; later packages ship `clickhouse` with a `server`
/// subcommand).
const CANDIDATES: &[(&str, &[&str])] = &[
    ("/usr/sbin/clickhouse-server", &[]),
    ("/usr/bin/clickhouse-server", &[]),
    ("/usr/bin/clickhouse", &["server"]),
];
/// Ready in about 0.2 s here; this much allows for a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often `/ping` is tried while the server starts.
const PING_EVERY: Duration = Duration::from_millis(10);
/// Starts tried on fresh ports: a port found free may be taken by a parallel test
/// before the server binds it.
const START_ATTEMPTS: usize = 3;
/// The user the sink logs in as, with a password, so authentication is exercised.
pub const USER: &str = "sink";
pub const PASSWORD: &str = "sink-secret";

/// The server binary and the arguments before `--config-file`, if installed.
pub fn binary() -> Option<(PathBuf, Vec<String>)> {
    if let Some(path) = std::env::var_os("CLICKHOUSE_SERVER") {
        return Some((PathBuf::from(path), Vec::new()));
    }
    CANDIDATES
        .iter()
        .find(|(path, _)| Path::new(path).exists())
        .map(|(path, args)| {
            (
                PathBuf::from(path),
                args.iter().map(|a| a.to_string()).collect(),
            )
        })
}

/// Panics, saying what to install, when clickhouse-server is missing: a test that
/// needs it fails rather than passing without it.
pub fn require_installed() {
    assert!(
        binary().is_some(),
        "the ClickHouse sink tests need clickhouse-server: run .ci/run, or \
         apt-get install clickhouse-server, or set CLICKHOUSE_SERVER"
    );
}

/// A running server and the database a test owns on it.
pub struct ClickHouse {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub database: String,
    /// How long the last start took until `/ping` answered.
    pub started_in: Duration,
    dir: tempfile::TempDir,
    /// The nice value the server runs at (0: as the tests' own processes).
    nice: i32,
}

impl ClickHouse {
    /// Start a server and create `database` on it; panics if the server is not
    /// installed ([`require_installed`]).
    pub fn start(database: &str) -> ClickHouse {
        ClickHouse::start_niced(database, 0)
    }

    /// The same with the server at nice value `nice`, as one may run a server beside
    /// flagpost on one machine (the load harness measures both ways).
    pub fn start_niced(database: &str, nice: i32) -> ClickHouse {
        require_installed();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ch = ClickHouse {
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            database: database.to_string(),
            started_in: Duration::ZERO,
            dir,
            nice,
        };
        for attempt in 1..=START_ATTEMPTS {
            ch.addr = free_port();
            write_config(ch.dir.path(), ch.addr);
            match ch.spawn() {
                Ok(()) => break,
                Err(e) if attempt < START_ATTEMPTS => eprintln!("retrying: {e}"),
                Err(e) => panic!("{e}"),
            }
        }
        ch.admin(&format!("DROP DATABASE IF EXISTS {database}"));
        ch.admin(&format!("CREATE DATABASE {database}"));
        ch
    }

    /// The URL the sink is given.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Resident memory of the server process, from /proc, in kB.
    pub fn rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Start the server and wait for `/ping`; an error if it exited first.
    fn spawn(&mut self) -> Result<(), String> {
        let (bin, args) = binary().expect("installed");
        let config = self.dir.path().join("config.xml");
        let started = Instant::now();
        // At another priority through coreutils' `nice`, which execs the server (so
        // the pid stays the server's); only when asked, so the tests need no `nice`.
        let mut command = match self.nice {
            0 => Command::new(&bin),
            n => {
                let mut c = Command::new("nice");
                c.arg(format!("--adjustment={n}")).arg(&bin);
                c
            }
        };
        let child = command
            .args(&args)
            .arg(format!("--config-file={}", config.display()))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        self.child = Some(child);
        while try_send(self.addr, Req::get("/ping")).map(|r| r.status) != Some(200) {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "clickhouse-server exited with {status}: {}",
                    self.log()
                ));
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "clickhouse-server not ready after {START_TIMEOUT:?}: {}",
                self.log()
            );
            std::thread::sleep(PING_EVERY);
        }
        self.started_in = started.elapsed();
        Ok(())
    }

    /// Kill the server (as a crash would) and start it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn() {
            panic!("{e}");
        }
    }

    /// Start a stopped server again on the same port and data.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "clickhouse-server is running");
        if let Err(e) = self.spawn() {
            panic!("{e}");
        }
    }

    /// Kill the server by pid (SIGKILL) and wait for it; its data stays for a restart.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server's error log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log/server.err.log")).unwrap_or_default()
    }

    /// Run `sql` as the sink's user in the test's database; panics on an error.
    pub fn query(&self, sql: &str) -> String {
        let resp = self.post(&format!("/?database={}", self.database), sql, true);
        assert_eq!(resp.status, 200, "{sql}: {}", resp.text());
        resp.text()
    }

    /// Merge `table` until no row is left for `FINAL` to collapse. An `OPTIMIZE
    /// ... FINAL` does nothing, silently, while a background merge holds the parts,
    /// so it is repeated until the plain count is the collapsed one.
    pub fn merge(&self, table: &str) {
        let collapsed = self.query(&format!("SELECT count() FROM {table} FINAL"));
        crate::util::wait_for(&format!("{table} merged"), || {
            self.query(&format!("OPTIMIZE TABLE {table} FINAL"));
            let plain = self.query(&format!("SELECT count() FROM {table}"));
            (plain == collapsed).then_some(())
        });
    }

    /// Run `sql` as the sink's user; the raw answer, errors included.
    pub fn try_query(&self, sql: &str) -> Resp {
        self.post(&format!("/?database={}", self.database), sql, true)
    }

    /// Run `sql` without a database, as the sink's user; panics on an error.
    fn admin(&self, sql: &str) {
        let resp = self.post("/", sql, true);
        assert_eq!(resp.status, 200, "{sql}: {}", resp.text());
    }

    fn post(&self, path: &str, body: &str, auth: bool) -> Resp {
        let mut req = Req::post(path, body);
        if auth {
            let basic = crate::util::base64(format!("{USER}:{PASSWORD}").as_bytes());
            req = req.header("Authorization", &format!("Basic {basic}"));
        }
        try_send(self.addr, req).expect("clickhouse-server answers")
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port nobody listens on: bind port 0, note it, let it go.
fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr")
}

/// The least configuration 18.16 starts with: loopback HTTP only (the native port is
/// another free one, as the server insists on one), everything under `dir`, small
/// caches, UTC, and one user with a password and no other.
fn write_config(dir: &Path, addr: SocketAddr) {
    let d = dir.display();
    let tcp = free_port().port();
    let config = format!(
        r#"<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>{d}/log/server.log</log>
        <errorlog>{d}/log/server.err.log</errorlog>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{http}</http_port>
    <tcp_port>{tcp}</tcp_port>
    <path>{d}/data/</path>
    <tmp_path>{d}/tmp/</tmp_path>
    <user_files_path>{d}/user_files/</user_files_path>
    <format_schema_path>{d}/format_schemas/</format_schema_path>
    <users_config>{d}/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
</yandex>
"#,
        http = addr.port(),
    );
    let users = format!(
        r#"<?xml version="1.0"?>
<yandex>
    <profiles><default></default></profiles>
    <users>
        <{USER}>
            <password>{PASSWORD}</password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </{USER}>
    </users>
    <quotas><default></default></quotas>
</yandex>
"#
    );
    std::fs::write(dir.join("config.xml"), config).expect("write config.xml");
    std::fs::write(dir.join("users.xml"), users).expect("write users.xml");
}
