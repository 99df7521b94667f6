//! A recording stand-in between the edge and its upstream flagpost: it logs every
//! request (path, headers, JSON body) and then, as scripted, forwards it to upstream,
//! forwards it after a delay, or answers a status of its own. Plain threads on
//! 127.0.0.1:0 with kept-alive connections, as the edge's client pools them; it stops
//! when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::util::{send, Req};

/// What the fake does with the next requests.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Forward,
    /// Wait this long, then forward.
    Slow(Duration),
    /// Answer this status with an empty JSON object.
    Status(u16),
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `flag_keys` sent, sorted; `None` when absent.
    pub fn flag_keys(&self) -> Option<Vec<String>> {
        let mut keys: Vec<String> = self
            .body
            .get("flag_keys")?
            .as_array()?
            .iter()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect();
        keys.sort();
        Some(keys)
    }
}

pub struct Fake {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    mode: Arc<Mutex<Mode>>,
    stop: Arc<AtomicBool>,
}

impl Fake {
    /// A fake in front of `upstream`, forwarding.
    pub fn start(upstream: SocketAddr) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake");
        let addr = listener.local_addr().unwrap();
        let fake = Fake {
            addr,
            seen: Arc::default(),
            mode: Arc::new(Mutex::new(Mode::Forward)),
            stop: Arc::default(),
        };
        let (seen, mode, stop) = (fake.seen.clone(), fake.mode.clone(), fake.stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (seen, mode) = (seen.clone(), mode.clone());
                std::thread::spawn(move || serve(conn, upstream, &seen, &mode));
            }
        });
        fake
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// The requests that arrived for `distinct_id`.
    pub fn seen_for(&self, distinct_id: &Value) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.body.get("distinct_id") == Some(distinct_id))
            .cloned()
            .collect()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, upstream: SocketAddr, seen: &Mutex<Vec<Seen>>, mode: &Mutex<Mode>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    while let Some(req) = read_request(&mut reader) {
        seen.lock().unwrap().push(Seen {
            path: req.path.clone(),
            headers: req.headers.clone(),
            body: serde_json::from_slice(&req.body).unwrap_or(Value::Null),
        });
        let mode = *mode.lock().unwrap();
        let (status, body) = match mode {
            Mode::Status(status) => (status, b"{}".to_vec()),
            Mode::Forward | Mode::Slow(_) => {
                if let Mode::Slow(delay) = mode {
                    std::thread::sleep(delay);
                }
                let mut forwarded = Req::post(&req.path, req.body.clone());
                for (k, v) in &req.headers {
                    if !["host", "content-length", "connection"].contains(&k.as_str()) {
                        forwarded = forwarded.header(k, v);
                    }
                }
                let answer = send(upstream, forwarded);
                (answer.status, answer.body)
            }
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(&body).is_err() {
            return;
        }
    }
}

struct Request {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// One request off a kept-alive connection; `None` at its end.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        path,
        headers,
        body,
    })
}
