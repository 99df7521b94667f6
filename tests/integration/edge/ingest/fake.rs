//! A scriptable upstream for what a flagpost upstream does not do: it logs every
//! request it gets (path and query, headers, body) and answers each with the status
//! the test sets, on 127.0.0.1:0, one request per connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub target: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// The status it was answered with.
    pub status: u16,
}

pub struct Fake {
    pub addr: SocketAddr,
    status: Arc<AtomicU16>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Fake {
    /// A fake answering every request with `status`.
    pub fn start(status: u16) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = Fake {
            addr,
            status: Arc::new(AtomicU16::new(status)),
            seen: Arc::default(),
            stop: Arc::default(),
        };
        let (answer, seen, stop) = (fake.status.clone(), fake.seen.clone(), fake.stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (answer, seen) = (answer.clone(), seen.clone());
                std::thread::spawn(move || serve(stream, &answer, &seen));
            }
        });
        fake
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, answer: &AtomicU16, seen: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let status = answer.load(Ordering::SeqCst);
    seen.lock().unwrap().push(Seen {
        target,
        headers,
        body,
        status,
    });
    let text = br#"{"status":1}"#;
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    let _ = stream.write_all(text);
}
