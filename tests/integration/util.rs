//! Test harness: start the real `flagpost` binary on 127.0.0.1:0 with a temporary data
//! dir and database, talk to it over plain sockets, stop it gently or hard.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const KEY_ONE: &str = "phc_test_one";
pub const KEY_TWO: &str = "phc_test_two";
pub const PERSONAL_ONE: &str = "phx_test_one";
pub const PERSONAL_TWO: &str = "phx_test_two";

/// How long any single wait in a test may take before it fails: a bound on liveness, not
/// a measure of speed. The servers here are debug builds sharing two cores with the rest
/// of the suite; after a full disk heals, the compactor catches up on thousands of events
/// while three tables fold, which took over 30 s in a loaded CI run.
pub const WAIT: Duration = Duration::from_secs(60);

pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    args: Vec<String>,
    log: Arc<Mutex<String>>,
    /// Copies the server's stderr into `log` until the server exits.
    reader: Option<std::thread::JoinHandle<()>>,
    _tmp: Option<tempfile::TempDir>,
}

/// A fresh data dir with two projects and no flags.
pub fn data_dir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    fill_data_dir(tmp.path());
    tmp
}

/// Write the two projects and their empty flag files under `root/data`.
pub fn fill_data_dir(root: &Path) {
    let data = root.join("data");
    std::fs::create_dir_all(data.join("flags")).unwrap();
    std::fs::write(
        data.join("projects.json"),
        format!(
            r#"{{"projects": [
                {{"id": 1, "name": "one", "api_key": "{KEY_ONE}", "personal_api_keys": ["{PERSONAL_ONE}"]}},
                {{"id": 2, "name": "two", "api_key": "{KEY_TWO}", "personal_api_keys": ["{PERSONAL_TWO}"]}}
            ]}}"#
        ),
    )
    .unwrap();
    for id in [1, 2] {
        std::fs::write(
            data.join(format!("flags/{id}.json")),
            r#"{"flags": [], "group_type_mapping": {}, "cohorts": {}}"#,
        )
        .unwrap();
    }
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Start with extra `serve` flags.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_env(extra, &[])
    }

    /// Start with extra `serve` flags and environment variables.
    pub fn start_env(extra: &[&str], env: &[(&str, &OsStr)]) -> Server {
        let tmp = data_dir();
        let dir = tmp.path().to_path_buf();
        let mut s = Server::spawn_env(&dir, extra, env);
        s._tmp = Some(tmp);
        s
    }

    /// Start on an existing directory (after a restart).
    pub fn spawn(dir: &Path, extra: &[&str]) -> Server {
        Server::spawn_env(dir, extra, &[])
    }

    /// Start on an existing directory with extra environment variables.
    pub fn spawn_env(dir: &Path, extra: &[&str], env: &[(&str, &OsStr)]) -> Server {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut child = Command::new(env!("CARGO_BIN_EXE_flagpost"))
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--db")
            .arg(dir.join("db"))
            .args(&args)
            .env("FLAGPOST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn flagpost");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("listening on ") {
                    let addr = line[at + "listening on ".len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_string();
                    let _ = tx.send(addr);
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(WAIT) {
            Ok(a) => a.parse().expect("address"),
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start:\n{}", log.lock().unwrap());
            }
        };
        Server {
            child: Some(child),
            addr,
            dir: dir.to_path_buf(),
            args,
            log,
            reader: Some(reader),
            _tmp: None,
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    pub fn sighup(&self) {
        self.signal("-HUP");
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        self.signal("-TERM");
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                // The last lines may still be on their way from the pipe to the log.
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("server did not stop on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// [`Server::restart_hard`] with extra environment variables.
    pub fn restart_hard_env(mut self, env: &[(&str, &OsStr)]) -> Server {
        self.kill();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut next = Server::spawn_env(&self.dir.clone(), &args, env);
        next._tmp = self._tmp.take();
        next
    }

    /// Kill hard and start again on the same directory and flags.
    pub fn restart_hard(mut self) -> Server {
        self.kill();
        let mut next = Server::spawn(
            &self.dir.clone(),
            &self.args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        next._tmp = self._tmp.take();
        next
    }

    pub fn request(&self, req: Req) -> Resp {
        send(self.addr, req)
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request(Req::get(path))
    }

    pub fn post(&self, path: &str, body: impl Into<Vec<u8>>) -> Resp {
        self.request(Req::post(path, body))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A request, built up field by field.
#[derive(Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn get(path: &str) -> Req {
        Req {
            method: "GET".into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn post(path: &str, body: impl Into<Vec<u8>>) -> Req {
        Req {
            method: "POST".into(),
            body: body.into(),
            ..Req::get(path)
        }
    }

    pub fn method(mut self, m: &str) -> Req {
        self.method = m.into();
        self
    }

    pub fn header(mut self, k: &str, v: &str) -> Req {
        self.headers.push((k.into(), v.into()));
        self
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request on its own connection.
pub fn send(addr: SocketAddr, req: Req) -> Resp {
    try_send(addr, req).expect("a response")
}

/// One request on its own connection; None if the server was not there to answer.
pub fn try_send(addr: SocketAddr, req: Req) -> Option<Resp> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(WAIT)).ok()?;
    write_request(&mut stream, &req, true);
    read_response(&mut stream)
}

pub fn write_request(stream: &mut TcpStream, req: &Req, close: bool) {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        req.method, req.path, "localhost"
    );
    for (k, v) in &req.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !req
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        && (req.method != "GET" || !req.body.is_empty())
    {
        head.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&req.body);
    // The server may answer (413) and close before the whole body is written.
    let _ = stream.write_all(&bytes);
}

/// Post `/batch/` requests of `size` events (each its own distinct id and uuid) to the
/// project of `KEY_ONE` until `stop`; `answered` gets each batch's uuids and its answer,
/// `None` when none came.
pub fn post_batches_until(
    addr: SocketAddr,
    stop: &std::sync::atomic::AtomicBool,
    size: usize,
    mut answered: impl FnMut(Vec<String>, Option<Resp>),
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let uuids: Vec<String> = (0..size)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let batch: Vec<_> = uuids
            .iter()
            .map(|u| serde_json::json!({"event": "e", "distinct_id": u, "uuid": u}))
            .collect();
        let body = serde_json::json!({"api_key": KEY_ONE, "batch": batch}).to_string();
        let answer = try_send(addr, Req::post("/batch/", body));
        answered(uuids, answer);
    }
}

/// Read one response, Content-Length framed or chunked.
pub fn read_response(stream: &mut TcpStream) -> Option<Resp> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
        body
    } else {
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        reader.read_exact(&mut body).ok()?;
        body
    };
    Some(Resp {
        status,
        headers,
        body,
    })
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use flate2::write::GzEncoder;
    let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Percent-encode for a form field or query parameter.
pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Replace a file in one step (write a sibling, rename it over), so a server polling
/// the directory never reads it half-written.
pub fn write_atomically(path: &Path, contents: impl AsRef<[u8]>) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Poll until `f` returns Some, or fail after [`WAIT`].
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    /// GET on the read API with a bearer key.
    pub fn api(&self, path: &str, key: &str) -> Resp {
        self.request(Req::get(path).header("Authorization", &format!("Bearer {key}")))
    }

    /// Every stored event of a project, newest first, through the NDJSON export.
    pub fn stored_events(&self, project: u64) -> Vec<serde_json::Value> {
        let key = if project == 1 {
            PERSONAL_ONE
        } else {
            PERSONAL_TWO
        };
        let r = self.request(
            Req::get(&format!("/api/projects/{project}/events/"))
                .header("Authorization", &format!("Bearer {key}"))
                .header("Accept", "application/x-ndjson"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
            .collect()
    }

    /// Poll until at least `n` events of the project are stored; returns them all.
    pub fn wait_for_events(&self, project: u64, n: usize) -> Vec<serde_json::Value> {
        wait_for(&format!("{n} stored events"), || {
            let events = self.stored_events(project);
            (events.len() >= n).then_some(events)
        })
    }

    /// Capture a marker event and wait until it is stored and nothing waits in the log
    /// or a slower lane: everything captured before it has been compacted by then.
    pub fn settle(&self, project: u64) -> Vec<serde_json::Value> {
        let key = if project == 1 { KEY_ONE } else { KEY_TWO };
        let marker = uuid::Uuid::now_v7().to_string();
        let body = serde_json::json!({"api_key": key, "event": "settle", "distinct_id": "settle", "uuid": marker});
        assert_eq!(self.post("/capture/", body.to_string()).status, 200);
        let deadline = Instant::now() + WAIT;
        while !self
            .stored_events(project)
            .iter()
            .any(|e| e["id"] == marker.as_str())
        {
            // The server's own account says why: a failing compactor, a full disk.
            if Instant::now() >= deadline {
                let log = self.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = &lines[lines.len().saturating_sub(80)..];
                panic!(
                    "timed out waiting for the marker event; the server's log ends:\n{}",
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The marker passes events parked in a slower lane (a historical import, or a
        // distinct id over its rate goes to the overflow lane): wait for those too.
        wait_for("the slower lanes to drain", || {
            let metrics = self.get("/metrics").text();
            metrics
                .lines()
                .any(|l| l == "flagpost_log_depth 0")
                .then_some(())
        });
        let events = self.stored_events(project);
        events
            .into_iter()
            .filter(|e| e["event"] != "settle")
            .collect()
    }
}

impl Server {
    /// Keep a data dir alive as long as the server (for servers started with `spawn`
    /// on a dir the test prepared).
    pub fn keep(&mut self, tmp: tempfile::TempDir) {
        self._tmp = Some(tmp);
    }
}

/// Run the flagpost binary with `args` (an offline command) and wait for it.
pub fn flagpost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(args)
        .output()
        .expect("run flagpost")
}

/// A command's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
