//! A recording pass-through in front of the server: the client is pointed at it, it
//! forwards each request unchanged (one request per connection) and keeps what went
//! over the wire both ways, with the events of every capture request decoded. This
//! is how the driver knows exactly what the unchanged client sent, which the
//! client's own API does not tell (uuids and timestamps it filled in, headers such as
//! `If-None-Match`, the status of each definitions poll).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};

/// The requests seen so far, in the order they were answered.
pub type Log = Arc<Mutex<Vec<Value>>>;

/// Start forwarding to `upstream` (`host:port`); returns the address to point the
/// client at and the log.
pub fn start(upstream: SocketAddr) -> (SocketAddr, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the recording proxy");
    let addr = listener.local_addr().expect("proxy address");
    let log: Log = Arc::default();
    let sink = log.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || {
                if let Err(e) = relay(conn, upstream, &sink) {
                    sink.lock().unwrap().push(json!({"proxy_error": e}));
                }
            });
        }
    });
    (addr, log)
}

struct Message {
    head: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn header_map(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in &self.headers {
            m.insert(k.to_ascii_lowercase(), json!(v));
        }
        Value::Object(m)
    }

    /// The message re-framed with `Content-Length` and `Connection: close`.
    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.head);
        for (k, v) in &self.headers {
            let skip = ["connection", "content-length", "transfer-encoding"];
            if !skip.iter().any(|s| k.eq_ignore_ascii_case(s)) {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// Read one HTTP/1.1 message: Content-Length framed, chunked, or (a response
/// without either) up to the end of the stream.
fn read_message(r: &mut impl BufRead, is_response: bool) -> Result<Message, String> {
    let mut head = String::new();
    r.read_line(&mut head).map_err(|e| e.to_string())?;
    let head = head.trim_end().to_string();
    if head.is_empty() {
        return Err("connection closed before a message".into());
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').ok_or(format!("bad header {line:?}"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut m = Message {
        head,
        headers,
        body: Vec::new(),
    };
    let status = m.head.split_whitespace().nth(1).unwrap_or("");
    let bodiless = is_response && (status == "304" || status == "204");
    if bodiless {
        return Ok(m);
    }
    if m.header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).map_err(|e| e.to_string())?;
            let size = usize::from_str_radix(size.trim(), 16).map_err(|e| e.to_string())?;
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).map_err(|e| e.to_string())?;
            if size == 0 {
                break;
            }
            m.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = m.header("content-length") {
        let len: usize = len.parse().map_err(|_| format!("bad length {len}"))?;
        m.body = vec![0; len];
        r.read_exact(&mut m.body).map_err(|e| e.to_string())?;
    } else if is_response {
        r.read_to_end(&mut m.body).map_err(|e| e.to_string())?;
    }
    Ok(m)
}

fn relay(conn: TcpStream, upstream: SocketAddr, log: &Log) -> Result<(), String> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut client = BufReader::new(conn);
    let request = match read_message(&mut client, false) {
        Ok(r) => r,
        // An idle connection the client opened and closed again.
        Err(e) if e.starts_with("connection closed") => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut server = TcpStream::connect(upstream).map_err(|e| e.to_string())?;
    server
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    server
        .write_all(&request.bytes())
        .map_err(|e| e.to_string())?;
    let response = read_message(&mut BufReader::new(server), true)?;
    // Logged before the client has its answer: once a flush returns, what it sent
    // is in the log.
    let entry = describe(&request, &response, upstream);
    log.lock().unwrap().push(entry);
    client
        .get_mut()
        .write_all(&response.bytes())
        .map_err(|e| e.to_string())
}

/// A body as sent, decompressed by its `Content-Encoding`.
fn decoded(m: &Message) -> Result<Vec<u8>, String> {
    match m.header("content-encoding") {
        None | Some("identity") => Ok(m.body.clone()),
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&m.body[..])
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip: {e}"))?;
            Ok(out)
        }
        Some("deflate") => {
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(&m.body[..])
                .read_to_end(&mut out)
                .map_err(|e| format!("deflate: {e}"))?;
            Ok(out)
        }
        Some(other) => Err(format!("content-encoding {other} not decoded")),
    }
}

/// A body as JSON when it is JSON, else as text.
fn body_value(m: &Message) -> Value {
    match decoded(m) {
        Ok(bytes) if bytes.is_empty() => Value::Null,
        Ok(bytes) => serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes))),
        Err(e) => json!({ "undecoded": e }),
    }
}

fn describe(request: &Message, response: &Message, upstream: SocketAddr) -> Value {
    let mut parts = request.head.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let body = body_value(request);
    let status: u16 = response
        .head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    json!({
        "method": method,
        "url": format!("http://{upstream}{target}"),
        "path": path,
        "query": query,
        "headers": request.header_map(),
        "content_encoding": request.header("content-encoding"),
        "body": body,
        "events": events(path, &body),
        "status": status,
        "response_headers": response.header_map(),
        "response": body_value(response),
    })
}

/// The events of a capture request: a `batch` array (`/batch/`, `/i/v1/…`) or one
/// event (`/i/v0/e/`, `/capture/`).
fn events(path: &str, body: &Value) -> Value {
    let capture = [
        "/batch",
        "/i/v0/e",
        "/capture",
        "/e",
        "/i/v1/analytics/events",
    ];
    if !capture.contains(&path.trim_end_matches('/')) {
        return json!([]);
    }
    let list: Vec<&Value> = match &body["batch"] {
        Value::Array(a) => a.iter().collect(),
        _ => vec![body],
    };
    list.into_iter()
        .map(|e| {
            json!({
                "uuid": e["uuid"], "event": e["event"], "distinct_id": e["distinct_id"],
                "properties": e["properties"], "timestamp": e["timestamp"],
            })
        })
        .collect()
}
