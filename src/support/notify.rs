//! The service manager's notification protocol (`sd_notify`). Under systemd with
//! `Type=notify`, `NOTIFY_SOCKET` names a datagram socket, and flagpost says there when
//! it is ready to serve, when a SIGHUP reload starts and ends, and when it is stopping,
//! so `systemctl start`, `reload` and `stop` wait for the real thing instead of guessing.
//! Without the variable every call is a no-op. Failing to notify is logged and never
//! stops the server: the protocol is advisory.
//!
//! The protocol is written here rather than taken from the `sd-notify` crate because
//! its newest version (0.5.0), tried against the cases this module covers, gets some of
//! them wrong: a `NOTIFY_SOCKET` of `@name` is connected as a file called `@name`
//! (ENOENT) instead of the abstract socket systemd means; `watchdog_enabled` reports a
//! watchdog for `WATCHDOG_USEC=0` (a zero interval, so pings without pause) and for a
//! `WATCHDOG_PID` that is not a number, where `sd_watchdog_enabled(3)` reports none; it
//! reads the socket only from the environment, so a test cannot point it at its own;
//! and it ends every state with a newline, so the datagrams differ from these. What
//! it would replace is one datagram per state change.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

/// The variable the service manager sets for `Type=notify` services.
const SOCKET_VAR: &str = "NOTIFY_SOCKET";

/// Startup finished (the listener accepts), or a reload finished.
pub const READY: &str = "READY=1";
/// Shutdown started: no new connections, in-flight requests finishing.
pub const STOPPING: &str = "STOPPING=1";
/// Still alive; under `WatchdogSec=` the manager restarts a service that stops saying so.
pub const WATCHDOG: &str = "WATCHDOG=1";
/// The watchdog's interval in microseconds, set with `WatchdogSec=`.
const WATCHDOG_VAR: &str = "WATCHDOG_USEC";
/// The process the watchdog is meant for; when set and not this one, it is a parent's.
const WATCHDOG_PID_VAR: &str = "WATCHDOG_PID";

/// Where state changes go: the socket named by `NOTIFY_SOCKET`.
#[derive(Debug)]
pub struct Notifier {
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier for a `NOTIFY_SOCKET` value: an absolute path, or `@name` for a
    /// Linux abstract socket (a leading NUL byte on the wire). Anything else (a relative
    /// path, systemd's `vsock:` form) is not supported here and gives `None`.
    pub fn parse(value: &OsStr) -> Option<Notifier> {
        let bytes = value.as_bytes();
        let addr = match bytes.first()? {
            b'/' => SocketAddr::from_pathname(value).ok()?,
            b'@' => abstract_addr(&bytes[1..])?,
            _ => return None,
        };
        Some(Notifier { addr })
    }

    pub fn ready(&self) -> io::Result<()> {
        self.send(READY)
    }

    pub fn stopping(&self) -> io::Result<()> {
        self.send(STOPPING)
    }

    /// A reload started. The timestamp lets the manager tell this reload from an
    /// earlier one; `READY=1` ends it.
    pub fn reloading(&self) -> io::Result<()> {
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()))
    }

    /// Startup is still progressing: the manager's start timeout moves `more` ahead.
    pub fn extend_timeout(&self, more: std::time::Duration) -> io::Result<()> {
        self.send(&format!("EXTEND_TIMEOUT_USEC={}", more.as_micros()))
    }

    /// One datagram from a fresh unbound socket, as `sd_notify(3)` does: state changes
    /// are rare, and keeping no socket open means nothing to share between threads.
    pub fn send(&self, state: &str) -> io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        socket.send_to_addr(state.as_bytes(), &self.addr)?;
        Ok(())
    }
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &[u8]) -> Option<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name).ok()
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_name: &[u8]) -> Option<SocketAddr> {
    None
}

/// `CLOCK_MONOTONIC` in microseconds, the clock systemd compares `MONOTONIC_USEC` with.
/// `Instant` reads the same clock but does not expose its value.
fn monotonic_usec() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec it is handed, which outlives
    // the call; CLOCK_MONOTONIC exists on every system this builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    debug_assert_eq!(rc, 0);
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// The process's notifier, read from the environment once.
fn global() -> Option<&'static Notifier> {
    static NOTIFIER: OnceLock<Option<Notifier>> = OnceLock::new();
    NOTIFIER
        .get_or_init(|| {
            let value = std::env::var_os(SOCKET_VAR)?;
            let notifier = Notifier::parse(&value);
            if notifier.is_none() {
                tracing::warn!("{SOCKET_VAR}={value:?} is not a socket flagpost can notify");
            }
            notifier
        })
        .as_ref()
}

fn report(what: &str, result: io::Result<()>) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not tell the service manager {what}");
    }
}

/// Tell the service manager that startup or a reload is complete.
pub fn ready() {
    // A reload the stop overtook ends without READY=1: the manager was told
    // STOPPING=1, and the service is not ready again.
    if STOPPING_SENT.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    if let Some(n) = global() {
        report("we are ready", n.ready());
    }
}

/// Set once shutdown has been announced; READY=1 is never said after it.
static STOPPING_SENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tell the service manager that shutdown has begun.
pub fn stopping() {
    STOPPING_SENT.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(n) = global() {
        report("we are stopping", n.stopping());
    }
}

/// Long startup work is still progressing: give it `more` time before the service
/// manager's start timeout (`TimeoutStartSec`) would stop it.
pub fn extend_timeout(more: std::time::Duration) {
    if let Some(n) = global() {
        report("we need more time to start", n.extend_timeout(more));
    }
}

/// How often the service manager expects [`watchdog`], if it watches this process:
/// `WATCHDOG_USEC`, unless `WATCHDOG_PID` names another process.
pub fn watchdog_interval() -> Option<std::time::Duration> {
    parse_watchdog(
        std::env::var(WATCHDOG_VAR).ok().as_deref(),
        std::env::var(WATCHDOG_PID_VAR).ok().as_deref(),
        std::process::id(),
    )
}

fn parse_watchdog(usec: Option<&str>, pid: Option<&str>, own: u32) -> Option<std::time::Duration> {
    if pid.is_some_and(|p| p.trim().parse::<u32>().ok() != Some(own)) {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| std::time::Duration::from_micros(usec))
}

/// Tell the service manager the process is alive and well (see [`WATCHDOG`]).
pub fn watchdog() {
    if let Some(n) = global() {
        report("we are alive", n.send(WATCHDOG));
    }
}

/// Tell the service manager that a reload has begun; follow with [`ready`].
pub fn reloading() {
    if let Some(n) = global() {
        report("we are reloading", n.reloading());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn receive(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a datagram");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    fn listen(socket: &UnixDatagram) {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
    }

    #[test]
    fn sends_the_exact_states_to_a_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        listen(&socket);
        let notifier = Notifier::parse(path.as_os_str()).expect("an absolute path");

        notifier.ready().unwrap();
        assert_eq!(receive(&socket), "READY=1");
        notifier.stopping().unwrap();
        assert_eq!(receive(&socket), "STOPPING=1");
        notifier.extend_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(receive(&socket), "EXTEND_TIMEOUT_USEC=60000000");

        let before = monotonic_usec();
        notifier.reloading().unwrap();
        let after = monotonic_usec();
        let message = receive(&socket);
        let usec = message
            .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
            .unwrap_or_else(|| panic!("{message:?}"));
        let usec: u64 = usec.parse().unwrap();
        assert!(
            (before..=after).contains(&usec),
            "{before} <= {usec} <= {after}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_at_sign_names_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("flagpost-notify-test-{}", std::process::id());
        let socket =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        listen(&socket);
        let notifier = Notifier::parse(OsStr::new(&format!("@{name}"))).unwrap();
        notifier.ready().unwrap();
        assert_eq!(receive(&socket), "READY=1");
    }

    #[test]
    fn the_watchdog_interval_is_ours_only() {
        let own = 4242;
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(parse_watchdog(Some("30000000"), None, own), secs(30));
        assert_eq!(
            parse_watchdog(Some("30000000"), Some("4242"), own),
            secs(30)
        );
        assert_eq!(parse_watchdog(Some("30000000"), Some("1"), own), None);
        assert_eq!(parse_watchdog(Some("0"), None, own), None);
        assert_eq!(parse_watchdog(Some("soon"), None, own), None);
        assert_eq!(parse_watchdog(None, Some("4242"), own), None);
    }

    #[test]
    fn other_forms_are_not_notified() {
        for value in ["", "notify", "run/notify", "vsock:2:1234"] {
            assert!(Notifier::parse(OsStr::new(value)).is_none(), "{value:?}");
        }
    }

    #[test]
    fn a_missing_listener_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let notifier = Notifier::parse(dir.path().join("gone").as_os_str()).unwrap();
        assert!(notifier.ready().is_err());
    }
}
