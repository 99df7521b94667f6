//! Running flagpost the way docs/operating.md deploys it: the systemd unit passes
//! `systemd-analyze` (verify, and a security exposure of at most 2.0), the server speaks
//! systemd's notify protocol, and the shipped nginx site, run for real in front of the
//! real binary, carries capture, batch, decide and the read API with the client's
//! address intact and a client unable to choose it.
//!
//! nginx and systemd-analyze are system tools, so the tests that drive them are
//! `#[ignore]`d with that reason: a plain `cargo test` lists them as ignored, and
//! `cargo test -- --include-ignored` (what `.ci/run` runs, after installing both) runs
//! them. Run without the tool, such a test fails and says so; it never passes by
//! skipping.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A system tool from PATH or an sbin directory (nginx is in /usr/sbin, which a user's
/// PATH may lack). The test fails if it is missing.
pub(crate) fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed; .ci/run installs it"))
}

fn test_db() -> String {
    format!("{REPO}/data/GeoIP2-City-Test.mmdb")
}

#[test]
#[ignore = "needs systemd-analyze: run by .ci/run, cargo test -- --include-ignored"]
fn the_unit_passes_systemd_analyze() {
    tool("systemd-analyze");
    let out = Command::new("bash")
        .arg(format!("{REPO}/systemd/verify.sh"))
        .env("FLAGPOST_BIN", env!("CARGO_BIN_EXE_flagpost"))
        .output()
        .expect("run systemd/verify.sh");
    let report = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("systemd-analyze verify: ok"), "{report}");
    assert!(report.contains("at most 2.0"), "{report}");

    // What makes a failed /_liveness a restart: the watchdog, and a restart on failure
    // (a watchdog timeout counts as one).
    let unit = std::fs::read_to_string(format!("{REPO}/systemd/flagpost.service")).unwrap();
    let service: Vec<&str> = unit
        .lines()
        .skip_while(|l| *l != "[Service]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .collect();
    for (key, expected) in [("Restart", "on-failure"), ("WatchdogSec", "30s")] {
        let values: Vec<&str> = service
            .iter()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect();
        assert_eq!(values, vec![expected], "{key}= in [Service]");
    }
}

#[test]
fn systemd_hears_the_watchdog_while_alive() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let server = Server::start_env(
        &[],
        &[
            ("NOTIFY_SOCKET", path.as_os_str()),
            ("WATCHDOG_USEC", std::ffi::OsStr::new("200000")),
        ],
    );
    let mut heard = Vec::new();
    while heard.iter().filter(|m| *m == "WATCHDOG=1").count() < 3 {
        let mut buf = [0; 256];
        let n = socket.recv(&mut buf).expect("a notification");
        heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(heard.contains(&"READY=1".to_string()), "{heard:?}");
    assert_eq!(server.get("/_liveness").status, 200);
}

#[test]
fn systemd_hears_ready_reloading_and_stopping() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let next = || {
        let mut buf = [0; 256];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };

    let mut server = Server::start_env(&[], &[("NOTIFY_SOCKET", path.as_os_str())]);
    assert_eq!(next(), "READY=1");
    assert_eq!(server.get("/_readiness").status, 200, "ready means serving");

    server.sighup();
    let reloading = next();
    let usec = reloading
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .unwrap_or_else(|| panic!("{reloading:?}"));
    assert!(usec.parse::<u64>().unwrap() > 0, "{reloading:?}");
    assert_eq!(next(), "READY=1", "the reload is over");

    assert_eq!(server.stop(), Some(0));
    assert_eq!(next(), "STOPPING=1");
}

/// An nginx process listening on free loopback ports, with a config written for those
/// ports. One process (`master_process off` in every test config), killed on drop, so
/// nothing outlives the test.
pub(crate) struct NginxProcess {
    child: Child,
    /// The ports the config was written for, in the order it was given them.
    pub(crate) addrs: Vec<SocketAddr>,
    dir: tempfile::TempDir,
}

impl NginxProcess {
    /// Start nginx on `ports` free loopback ports with `config(addrs, dir)` as its
    /// configuration, `dir` being its own temporary directory.
    pub(crate) fn start(ports: usize, config: impl Fn(&[SocketAddr], &Path) -> String) -> Self {
        let bin = tool("nginx");
        // Ports picked now may be taken before nginx binds them: then try new ones.
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let addrs = free_addrs(ports);
            std::fs::write(dir.path().join("nginx.conf"), config(&addrs, dir.path())).unwrap();
            let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
            let child = Command::new(&bin)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(dir.path().join("nginx.conf"))
                .args(["-e", "stderr", "-g"])
                .arg(format!(
                    "daemon off; pid {}/nginx.pid; error_log stderr warn;",
                    dir.path().display()
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("spawn nginx");
            let mut nginx = NginxProcess { child, addrs, dir };
            if nginx.wait_until_listening() {
                return nginx;
            }
            assert!(
                nginx.log().contains("Address already in use"),
                "nginx did not start:\n{}",
                nginx.log()
            );
        }
        panic!("nginx found no free ports in five tries");
    }

    /// Whether every port accepts connections; false if nginx exited instead.
    fn wait_until_listening(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if self.addrs.iter().all(|a| TcpStream::connect(a).is_ok()) {
                return true;
            }
            assert!(Instant::now() < deadline, "nginx:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for NginxProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx with the shipped site in front of a flagpost.
pub(crate) struct Nginx {
    process: NginxProcess,
    /// The site's TLS server, plain HTTP here: a test has no certificate.
    addr: SocketAddr,
    /// The site's port-80 server, which redirects.
    redirect: SocketAddr,
}

impl Nginx {
    pub(crate) fn start(upstream: SocketAddr) -> Nginx {
        let site = std::fs::read_to_string(format!("{REPO}/systemd/nginx.conf")).unwrap();
        let process = NginxProcess::start(2, |addrs, dir| {
            test_config(&site, upstream, addrs[0], addrs[1], dir)
        });
        let (addr, redirect) = (process.addrs[0], process.addrs[1]);
        Nginx {
            process,
            addr,
            redirect,
        }
    }

    fn log(&self) -> String {
        self.process.log()
    }

    pub(crate) fn request(&self, req: Req) -> Resp {
        send(self.addr, req)
    }
}

/// `n` distinct free loopback addresses: every listener is held until all are known.
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter().map(|l| l.local_addr().unwrap()).collect()
}

/// The shipped site with its listen addresses and upstream replaced, inside the `http`
/// block that nginx.conf normally provides, with every path in the test's directory.
fn test_config(
    site: &str,
    upstream: SocketAddr,
    addr: SocketAddr,
    redirect: SocketAddr,
    dir: &Path,
) -> String {
    let mut site = site.to_string();
    for (from, to) in [
        ("server 127.0.0.1:8000;", format!("server {upstream};")),
        (
            "    listen 443 ssl http2;\n",
            format!("    listen {addr};\n"),
        ),
        ("    listen [::]:443 ssl http2;\n", String::new()),
        ("    listen 80;\n", format!("    listen {redirect};\n")),
        ("    listen [::]:80;\n", String::new()),
    ] {
        // The test must run the file as shipped, not quietly something else.
        assert_eq!(site.matches(from).count(), 1, "nginx.conf: {from:?}");
        site = site.replace(from, &to);
    }
    let tmp = dir.display();
    format!(
        r#"# Generated by tests/integration/ops.rs from systemd/nginx.conf.
master_process off;
events {{
    worker_connections 256;
}}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    # Test only: take the client address from a header, so a test on 127.0.0.1 can
    # come from London. The shipped site trusts no header.
    set_real_ip_from 127.0.0.1;
    real_ip_header X-Test-Client-IP;

{site}
}}
"#
    )
}

/// A capture request as a client at `client` sends it, with a forged X-Forwarded-For.
pub(crate) fn from_client(req: Req, client: &str, forged: &str) -> Req {
    req.header("X-Test-Client-IP", client)
        .header("X-Forwarded-For", forged)
}

fn props<'a>(events: &'a [Value], name: &str) -> &'a Value {
    &events
        .iter()
        .find(|e| e["event"] == name)
        .unwrap_or_else(|| panic!("no {name} event"))["properties"]
}

#[test]
#[ignore = "needs nginx: run by .ci/run, cargo test -- --include-ignored"]
fn capture_and_batch_through_nginx_keep_the_client_address() {
    let server = Server::start_with(&["--geoip", &test_db()]);
    let nginx = Nginx::start(server.addr);

    let event = json!({"api_key": KEY_ONE, "event": "from-london", "distinct_id": "visitor"});
    let req = Req::post("/capture/", event.to_string());
    let r = nginx.request(from_client(req, "81.2.69.160", "2.125.160.216"));
    assert_eq!((r.status, r.text()), (200, r#"{"status":1}"#.to_string()));

    let event = json!({"api_key": KEY_ONE, "event": "forged-only", "distinct_id": "local"});
    let req = Req::post("/capture/", event.to_string());
    assert_eq!(
        nginx
            .request(from_client(req, "10.1.2.3", "81.2.69.160"))
            .status,
        200
    );

    // Well past nginx's 16 KB body buffer, which would spool to disk if buffering.
    let batch: Vec<Value> = (0..1000)
        .map(|i| {
            json!({"event": "batched", "distinct_id": format!("user-{i}"),
            "properties": {"n": i, "tag": uuid::Uuid::new_v4().to_string()}})
        })
        .collect();
    let body = gzip(
        json!({"api_key": KEY_ONE, "batch": batch})
            .to_string()
            .as_bytes(),
    );
    assert!(body.len() > 16 * 1024, "{} bytes", body.len());
    let req = Req::post("/batch/", body).header("Content-Encoding", "gzip");
    let r = nginx.request(from_client(req, "2001:218::1", "81.2.69.160"));
    assert_eq!((r.status, r.text()), (200, r#"{"status":1}"#.to_string()));

    let events = server.settle(1);
    assert_eq!(events.len(), 1002);
    let london = props(&events, "from-london");
    assert_eq!(
        london["$ip"], "81.2.69.160",
        "the forged entry nginx kept on the left is not believed"
    );
    assert_eq!(london["$geoip_city_name"], "London");
    assert_eq!(london["$geoip_country_code"], "GB");
    let local = props(&events, "forged-only");
    assert_eq!(local["$ip"], "10.1.2.3");
    assert!(local.get("$geoip_country_code").is_none(), "{local}");
    for e in events.iter().filter(|e| e["event"] == "batched") {
        assert_eq!(e["properties"]["$ip"], "2001:218::1");
        assert_eq!(e["properties"]["$geoip_country_code"], "JP");
    }

    // The read API through nginx: the NDJSON export streams, unbuffered, in full.
    let r = nginx.request(
        Req::get("/api/projects/1/events/")
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            .header("Accept", "application/x-ndjson"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let exported: Vec<Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(exported, server.stored_events(1));
    assert!(
        !nginx.log().contains("buffered to a temporary file"),
        "{}",
        nginx.log()
    );
}

#[test]
#[ignore = "needs nginx: run by .ci/run, cargo test -- --include-ignored"]
fn decide_through_nginx_sees_the_client_location() {
    let server = Server::start_with(&["--geoip", &test_db()]);
    let nginx = Nginx::start(server.addr);
    let rules = json!({"flags": [{"id": 1, "key": "uk-only", "active": true, "filters": {"groups": [
        {"properties": [{"key": "$geoip_country_code", "value": "GB", "operator": "exact", "type": "person"}], "rollout_percentage": 100}]}}]});
    std::fs::write(server.data().join("flags/1.json"), rules.to_string()).unwrap();
    server.sighup();

    let decide = |client: &str, forged: &str| {
        let body = json!({"token": KEY_ONE, "distinct_id": "d"}).to_string();
        let r = nginx.request(from_client(Req::post("/decide/?v=3", body), client, forged));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["featureFlags"]["uk-only"].clone()
    };
    wait_for("the rules", || {
        (decide("81.2.69.160", "2001:218::1") == true).then_some(())
    });
    assert_eq!(decide("2.125.160.216", "2001:218::1"), true);
    assert_eq!(
        decide("2001:218::1", "81.2.69.160"),
        false,
        "forged header ignored"
    );
}

#[test]
#[ignore = "needs nginx: run by .ci/run, cargo test -- --include-ignored"]
fn nginx_limits_agree_with_flagpost_and_port_80_redirects() {
    let server = Server::start();
    let nginx = Nginx::start(server.addr);
    let limit = 20 * 1024 * 1024;

    // One byte over: nginx refuses by Content-Length, with flagpost's own answer and
    // its CORS headers, with and without an Origin.
    for origin in [Some("https://shop.example"), None] {
        let over = |addr| {
            let req = Req::post("/batch/", "x").header("Content-Length", &(limit + 1).to_string());
            send(
                addr,
                origin.map_or(req.clone(), |o| req.header("Origin", o)),
            )
        };
        let (direct, proxied) = (over(server.addr), over(nginx.addr));
        assert_eq!((direct.status, proxied.status), (413, 413));
        assert_eq!(proxied.json(), direct.json());
        for header in [
            "content-type",
            "access-control-allow-origin",
            "access-control-allow-credentials",
        ] {
            assert_eq!(
                proxied.header(header),
                direct.header(header),
                "{header} with {origin:?}"
            );
        }
    }

    // Exactly the limit: nginx streams it to flagpost, which finds no JSON in it.
    let r = nginx.request(Req::post("/batch/", vec![b'x'; limit]));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["code"], "invalid_payload");

    assert_eq!(nginx.request(Req::get("/_readiness")).status, 200);
    assert_eq!(server.get("/metrics").status, 200);
    assert_eq!(
        nginx.request(Req::get("/metrics")).status,
        404,
        "not public"
    );

    // 308 keeps the method and body of a POST that follows it.
    let r = send(nginx.redirect, Req::post("/batch/?ver=1", "{}"));
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("https://localhost/batch/?ver=1"));
}
