//! A recording stand-in between the edge and its upstream flagpost: it logs every
//! request (path, headers, JSON body) and then, as scripted, forwards it to upstream,
//! forwards it after a delay, or answers a status of its own. Plain threads on
//! 127.0.0.1:0 with kept-alive connections, as the edge's client pools them; it stops
//! when dropped.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::edge::wire::read_request;
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
                let (seen, mode, stop) = (seen.clone(), mode.clone(), stop.clone());
                std::thread::spawn(move || serve(conn, upstream, &seen, &mode, &stop));
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

fn serve(
    conn: TcpStream,
    upstream: SocketAddr,
    seen: &Mutex<Vec<Seen>>,
    mode: &Mutex<Mode>,
    stop: &AtomicBool,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    while let Some(req) = read_request(&mut reader, stop) {
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
                    let hop = ["host", "content-length", "connection"];
                    if !hop.iter().any(|h| k.eq_ignore_ascii_case(h)) {
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
