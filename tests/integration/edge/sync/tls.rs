//! The sync over TLS: nginx on loopback with a self-signed certificate (made here by
//! `openssl req`) in front of a flagpost upstream, the edge given `https://127.0.0.1:PORT`
//! and the certificate through `SSL_CERT_FILE`, as an operator trusting a private CA
//! would. The certificate names `127.0.0.1` (an IP SAN) and `localhost`.

use std::ffi::OsStr;
use std::process::Command;

use serde_json::json;

use super::{edge, metric, upstream_with};
use crate::ops::{tool, NginxProcess};
use crate::util::*;

#[test]
#[ignore = "needs nginx and openssl: run by .ci/run, cargo test -- --include-ignored"]
fn the_sync_runs_over_tls_with_the_certificate_from_ssl_cert_file() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let made = Command::new(tool("openssl"))
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        // A server's certificate, not a CA's (which rustls refuses as a server's).
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "{}", text(&made.stderr));

    let (up, _) = upstream_with("over-tls");
    let (cert_path, key_path, to) = (
        cert.display().to_string(),
        key.display().to_string(),
        up.addr,
    );
    let nginx = NginxProcess::start(1, |addrs, dir| {
        format!(
            "master_process off; worker_processes 1; events {{}}
            http {{
                access_log off;
                client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
                fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
                server {{
                    listen {listen} ssl;
                    server_name localhost;
                    ssl_certificate {cert_path};
                    ssl_certificate_key {key_path};
                    location / {{
                        proxy_pass http://{to};
                        proxy_http_version 1.1;
                        proxy_set_header Connection \"\";
                        proxy_set_header Host $host;
                    }}
                }}
            }}",
            d = dir.display(),
            listen = addrs[0],
        )
    });
    let url = format!("https://{}", nginx.addrs[0]);
    let edge = edge(&url, &[("SSL_CERT_FILE", OsStr::new(&cert_path))]);
    let served = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        super::decide(&edge, "ada")["featureFlags"]["over-tls"] == json!(true)
    });
    assert!(
        served,
        "not synced over TLS:\n{}\n{}",
        edge.log(),
        nginx.log()
    );
    assert!(
        metric(
            &edge,
            r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="200"}"#
        ) >= 1.0
    );
    // The next polls are conditional and answered 304 through nginx.
    wait_for("a 304 over TLS", || {
        (metric(
            &edge,
            r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="304"}"#,
        ) >= 1.0)
            .then_some(())
    });

    // Without the certificate the edge refuses upstream (and says so), serving nothing synced.
    let untrusting = edge_without_ca(&url);
    wait_for("a refused TLS handshake", || {
        (metric(
            &untrusting,
            r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="error"}"#,
        ) >= 1.0)
            .then_some(())
    });
    let d = super::decide(&untrusting, "ada");
    assert!(d["featureFlags"].get("over-tls").is_none(), "{d}");
}

/// An edge whose CA store is a file holding no certificate for this upstream (the
/// system's own store, as `SSL_CERT_FILE` pointing at it gives).
fn edge_without_ca(url: &str) -> Server {
    let system = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("a system CA bundle");
    edge(url, &[("SSL_CERT_FILE", OsStr::new(system))])
}
