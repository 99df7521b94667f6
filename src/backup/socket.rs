//! The running server's admin socket, `<db>/admin.sock`, and `flagpost backup`'s end of
//! it. One request per connection, one JSON line each way:
//! `{"backup_to":"/abs/dest"}` is answered `{"ok":<manifest>}` or `{"error":"..."}`.
//!
//! The socket is bound under a temporary name, given mode 0600 and renamed into place,
//! so it is never reachable by anyone but the service's user (and root). Requests are
//! served one at a time: a second backup waits for the first.

use std::io::{BufRead, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::{Manifest, Paused, Running};

/// The socket's name in the database directory.
pub const SOCKET: &str = "admin.sock";
/// How long a backup waits for the compactor's step or the sink's pass to finish.
const PAUSE_PATIENCE: Duration = Duration::from_secs(60);
/// How long a client has to send its request.
const REQUEST_PATIENCE: Duration = Duration::from_secs(10);
const MAX_REQUEST: u64 = 64 * 1024;

#[derive(Serialize, Deserialize)]
struct Request {
    backup_to: PathBuf,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Answer {
    Ok(Box<Manifest>),
    Error(String),
}

/// The listening socket; [`Listener::close`] stops it and removes its file.
pub struct Listener {
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

impl Listener {
    pub fn close(self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listen on `<db>/admin.sock` (a file left there by a server that did not stop cleanly
/// is replaced: this server holds the database's lock). Call inside the runtime.
pub fn listen(running: Running) -> std::io::Result<Listener> {
    let path = running.db_dir.join(SOCKET);
    let tmp = running.db_dir.join("admin.sock.tmp");
    for stale in [&tmp, &path] {
        match std::fs::remove_file(stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let listener = UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, &path)?;
    tracing::info!(socket = %path.display(), "admin socket ready for `flagpost backup`");
    let task = tokio::spawn(serve(listener, Arc::new(running)));
    Ok(Listener { task, path })
}

async fn serve(listener: UnixListener, running: Arc<Running>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => answer(stream, &running).await,
            Err(e) => {
                tracing::warn!(error = %e, "admin socket: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(stream: UnixStream, running: &Arc<Running>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    let request = match tokio::time::timeout(REQUEST_PATIENCE, reader.read_line(&mut line)).await {
        Ok(Ok(_)) => {
            serde_json::from_str::<Request>(&line).map_err(|e| format!("bad request: {e}"))
        }
        Ok(Err(e)) => Err(format!("cannot read the request: {e}")),
        Err(_) => Err("no request within 10 s".into()),
    };
    let answer = match request {
        Ok(request) => match backup(running, request.backup_to).await {
            Ok(manifest) => Answer::Ok(Box::new(manifest)),
            Err(e) => {
                tracing::warn!(error = %e, "backup not written");
                Answer::Error(e)
            }
        },
        Err(e) => Answer::Error(e),
    };
    let mut text = serde_json::to_vec(&answer).unwrap_or_default();
    text.push(b'\n');
    let _ = write.write_all(&text).await;
}

async fn backup(running: &Arc<Running>, dest: PathBuf) -> Result<Manifest, String> {
    if !dest.is_absolute() {
        return Err(format!("{} is not an absolute path", dest.display()));
    }
    tracing::info!(to = %dest.display(), "backup asked for");
    // The sink first: waiting for its ClickHouse insert does not hold the compactor.
    let sink = match &running.sink_gate {
        Some(gate) => Some(
            tokio::time::timeout(PAUSE_PATIENCE, gate.clone().write_owned())
                .await
                .map_err(|_| {
                    "the ClickHouse sink did not finish its pass within 60 s; try again"
                })?,
        ),
        None => None,
    };
    let compactor =
        tokio::time::timeout(PAUSE_PATIENCE, running.compactor_gate.clone().write_owned())
            .await
            .map_err(|_| "the compactor did not finish its step within 60 s; try again")?;
    let paused = Paused {
        sink,
        compactor: Some(compactor),
    };
    let running = running.clone();
    let manifest =
        tokio::task::spawn_blocking(move || super::take_running(&running, &dest, paused))
            .await
            .map_err(|e| format!("the backup task failed: {e}"))??;
    tracing::info!(
        bytes = manifest.bytes(),
        compactor_paused_ms = manifest.compactor_paused_ms,
        took_ms = manifest.took_ms,
        checkpoint = manifest.checkpoint,
        log_end = manifest.log_end,
        "backup written"
    );
    Ok(manifest)
}

/// What asking the server for a backup came to.
pub enum Asked {
    Done(Box<Manifest>),
    /// No server listens on the database's socket.
    NoServer,
}

/// Ask the server running on `db_dir` for a backup into `dest`. Blocking; waits as
/// long as the backup takes.
pub fn request(db_dir: &Path, dest: &Path) -> Result<Asked, String> {
    let path = db_dir.join(SOCKET);
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(stream) => stream,
        Err(e) => {
            return match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => Ok(Asked::NoServer),
                std::io::ErrorKind::PermissionDenied => Err(format!(
                    "cannot connect to {}: permission denied; run as the service's user (sudo -u flagpost) or root",
                    path.display()
                )),
                _ => Err(format!("cannot connect to {}: {e}", path.display())),
            }
        }
    };
    let dest = std::path::absolute(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let mut text = serde_json::to_vec(&Request { backup_to: dest }).map_err(|e| e.to_string())?;
    text.push(b'\n');
    stream
        .write_all(&text)
        .map_err(|e| format!("cannot send to {}: {e}", path.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("no answer from {}: {e}", path.display()))?;
    match serde_json::from_str::<Answer>(&line) {
        Ok(Answer::Ok(manifest)) => Ok(Asked::Done(manifest)),
        Ok(Answer::Error(e)) => Err(e),
        Err(_) if line.is_empty() => Err(format!(
            "the server closed {} without answering (did it stop?)",
            path.display()
        )),
        Err(e) => Err(format!("unexpected answer from {}: {e}", path.display())),
    }
}
