//! A scripted upstream for what a flagpost upstream does not do: weak ETags, 402, 429
//! with `Retry-After`, 503, slow answers, refused connections, a quota-limited `/flags`
//! answer. Plain HTTP/1.1 with kept-alive connections on 127.0.0.1:0; each request is
//! recorded (path, headers, body, arrival) and answered with what the script returns
//! for it. Closing the fake drops
//! its listener and its connections, so the next connection is refused.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::edge::wire::read_request;

/// One request as it arrived.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the fake answers.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// How long to wait before answering.
    pub delay: Duration,
}

impl Reply {
    pub fn new(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn body(mut self, body: &str) -> Reply {
        self.body = body.to_string();
        self
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_string()));
        self
    }

    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Script = Box<dyn FnMut(&Seen) -> Reply + Send>;

pub struct Fake {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<Script>>,
    closed: Arc<AtomicBool>,
}

impl Fake {
    pub fn start(script: impl FnMut(&Seen) -> Reply + Send + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let fake = Fake {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
            script: Arc::new(Mutex::new(Box::new(script))),
            closed: Arc::default(),
        };
        let (seen, script, closed) = (fake.seen.clone(), fake.script.clone(), fake.closed.clone());
        std::thread::spawn(move || {
            while !closed.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (seen, script, closed) = (seen.clone(), script.clone(), closed.clone());
                        std::thread::spawn(move || serve(stream, &seen, &script, &closed));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        fake
    }

    /// Answer from now on with `script`.
    pub fn script(&self, script: impl FnMut(&Seen) -> Reply + Send + 'static) {
        *self.script.lock().unwrap() = Box::new(script);
    }

    /// The definitions polls seen so far (the edge's other parts also ask upstream,
    /// for its config, surveys and more: those are not the sync's).
    pub fn seen(&self) -> Vec<Seen> {
        let polls = ["/flags/definitions", "/api/feature_flag/local_evaluation"];
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| polls.iter().any(|p| s.path.starts_with(p)))
            .cloned()
            .collect()
    }

    /// Every request seen whose path starts with `prefix`.
    pub fn seen_at(&self, prefix: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop listening and drop every connection: the next connection is refused.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Wait until `n` requests have arrived in all.
    pub fn wait_for_requests(&self, n: usize) -> Vec<Seen> {
        crate::util::wait_for(&format!("{n} requests at the fake upstream"), || {
            let seen = self.seen();
            (seen.len() >= n).then_some(seen)
        })
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.close();
    }
}

fn serve(stream: TcpStream, seen: &Mutex<Vec<Seen>>, script: &Mutex<Script>, closed: &AtomicBool) {
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader, closed) {
        let request = Seen {
            path: request.path,
            headers: request.headers,
            body: request.body,
            at: Instant::now(),
        };
        seen.lock().unwrap().push(request.clone());
        let reply = (script.lock().unwrap())(&request);
        std::thread::sleep(reply.delay);
        if closed.load(Ordering::SeqCst) {
            return;
        }
        let mut out = format!(
            "HTTP/1.1 {} X\r\ncontent-length: {}\r\n",
            reply.status,
            reply.body.len()
        );
        for (k, v) in &reply.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&reply.body);
        if writer.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}
