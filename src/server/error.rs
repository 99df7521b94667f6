//! Why the server could not start or stop cleanly, and what the operator can do about
//! it: each failure an operator can fix on their own (an address in use, a database
//! directory that cannot be written, a full disk) says how.

use std::path::{Path, PathBuf};

use crate::{geoip, projects, sink, store};

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("projects: {0}")]
    Projects(projects::Error),
    #[error("{0}")]
    GeoIp(geoip::Error),
    #[error("{0}")]
    Store(store::Error),
    #[error("{0}")]
    Io(std::io::Error),
    /// The ClickHouse sink could not start.
    #[error("{0}")]
    Sink(sink::Error),
    /// Edge mode's upstream cannot be reached as configured (no CA certificates, ...).
    #[error("{0}")]
    Upstream(crate::edge::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {0}: {1}; {advice}", advice = listen_advice(.1))]
    Listen(std::net::SocketAddr, std::io::Error),
    /// The database directory could not be created, written or locked.
    #[error("database {}: {problem}; {advice}", dir.display())]
    Database {
        dir: PathBuf,
        problem: String,
        advice: &'static str,
    },
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// What to do about an address that could not be bound.
fn listen_advice(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "another process (another flagpost?) is listening there: stop it, or choose another address with --listen"
        }
        std::io::ErrorKind::PermissionDenied => {
            "ports below 1024 need privileges: listen on a higher port behind nginx"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "this machine has no such address: choose one of its own with --listen"
        }
        _ => "choose another address with --listen",
    }
}

/// What to do when the database directory cannot be created or written.
const DB_DIR_ADVICE: &str =
    "the server's user must be able to create and write it: fix its permissions, or choose another --db";

/// Create the database directory if needed and make sure it can be written, so that a
/// failure names the directory rather than surfacing from inside the store.
pub(super) fn prepare_db_dir(dir: &Path) -> Result<(), Error> {
    let problem = |what: &str, e: std::io::Error| Error::Database {
        dir: dir.to_owned(),
        problem: format!("{what}: {e}"),
        advice: DB_DIR_ADVICE,
    };
    std::fs::create_dir_all(dir).map_err(|e| problem("cannot create it", e))?;
    let probe = dir.join(".flagpost-write-test");
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| problem("cannot write in it", e))
}

/// A store that would not open, with the directory and what to do.
pub(super) fn database_error(dir: &Path, e: store::Error) -> Error {
    if e.is_locked() {
        return Error::Database {
            dir: dir.to_owned(),
            problem: "already in use by another flagpost".into(),
            advice: "stop that server first, or give this one its own --db",
        };
    }
    if store::live::is_disk_full(&e) {
        return Error::Database {
            dir: dir.to_owned(),
            problem: "the disk is full".into(),
            advice: "free space on its disk and start again (under systemd the service is \
                     restarted by itself); nothing acknowledged is lost",
        };
    }
    Error::Database {
        dir: dir.to_owned(),
        problem: e.to_string(),
        advice:
            "it must be a flagpost database the server's user can write (or an empty directory)",
    }
}
