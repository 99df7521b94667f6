//! Command-line flags (argh), each with an environment fallback, turned into the
//! library's typed configuration. Flags only validate here; the library builds the
//! real objects.

use std::path::PathBuf;
use std::time::Duration;

use argh::FromArgs;
use flagpost::config::{self, Config};

pub mod allocator;
mod backup;
mod tools;
mod upstream;

#[derive(FromArgs)]
/// A single-binary edge server for product analytics, compatible with PostHog's clients.
pub struct Cli {
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    #[argh(subcommand)]
    command: Option<Command>,
}

#[derive(FromArgs)]
#[argh(subcommand)]
// Parsed once at start-up: the size of the largest variant costs nothing, and argh
// cannot derive a boxed subcommand.
#[allow(clippy::large_enum_variant)]
enum Command {
    Serve(Serve),
    Check(Check),
    Backup(backup::Backup),
    Restore(backup::Restore),
    Eval(tools::Eval),
    Export(Export),
    Key(tools::Key),
}

#[derive(FromArgs)]
/// Validate a data dir (projects, every flag file, the GeoIP database); exits 1 on errors,
/// among them every flag file the server would refuse (an unknown field, operator or
/// filter type, a percentage outside 0-100), and warns of flags it would serve off.
#[argh(subcommand, name = "check")]
struct Check {
    /// directory to check [env FLAGPOST_DATA_DIR, default ./data]
    #[argh(option)]
    data_dir: Option<PathBuf>,
    /// the flag files, which the management API and console write [env FLAGPOST_FLAGS_DIR, default <data dir>/flags]
    #[argh(option)]
    flags_dir: Option<PathBuf>,
    /// the GeoIP database to check [env FLAGPOST_GEOIP, default <data dir>/GeoLite2-City.mmdb if present]
    #[argh(option)]
    geoip: Option<PathBuf>,
    /// a stopped server's database to check instead (trees, event blocks, the write-ahead log)
    #[argh(option)]
    db: Option<PathBuf>,
}

#[derive(FromArgs)]
/// Write every stored event of a stopped server's database as NDJSON.
#[argh(subcommand, name = "export")]
struct Export {
    /// database directory [env FLAGPOST_DB, default ./var/db]
    #[argh(option)]
    db: Option<PathBuf>,
    /// file to write instead of standard output
    #[argh(option, short = 'o')]
    output: Option<PathBuf>,
}

#[derive(FromArgs)]
/// Serve capture, decide and the read API.
#[argh(subcommand, name = "serve")]
struct Serve {
    /// address to listen on [env FLAGPOST_LISTEN, default 127.0.0.1:8000]
    #[argh(option)]
    listen: Option<String>,
    /// directory with projects.json, flags/ and the GeoIP database [env FLAGPOST_DATA_DIR, default ./data]
    #[argh(option)]
    data_dir: Option<PathBuf>,
    /// the flag files, which the management API and console write [env FLAGPOST_FLAGS_DIR, default <data dir>/flags]
    #[argh(option)]
    flags_dir: Option<PathBuf>,
    /// database directory [env FLAGPOST_DB, default ./var/db]
    #[argh(option)]
    db: Option<PathBuf>,
    /// largest request body in bytes [env FLAGPOST_MAX_BODY_BYTES, default 20971520]
    #[argh(option)]
    max_body_bytes: Option<usize>,
    /// largest payload after decompression in bytes [env FLAGPOST_MAX_DECOMPRESSED_BYTES, default 104857600]
    #[argh(option)]
    max_decompressed_bytes: Option<usize>,
    /// most open connections [env FLAGPOST_MAX_CONNECTIONS, default 4096]
    #[argh(option)]
    max_connections: Option<usize>,
    /// most open connections from one client address [env FLAGPOST_MAX_CONNECTIONS_PER_ADDRESS, default 64; trusted proxies are not counted]
    #[argh(option)]
    max_connections_per_address: Option<usize>,
    /// milliseconds a client has to send the request line and headers [env FLAGPOST_HEADER_READ_TIMEOUT_MS, default 10000]
    #[argh(option)]
    header_read_timeout_ms: Option<u64>,
    /// milliseconds a client has to send the request body [env FLAGPOST_BODY_READ_TIMEOUT_MS, default 30000]
    #[argh(option)]
    body_read_timeout_ms: Option<u64>,
    /// milliseconds writing an answer may wait for a client that reads none of it before the connection is closed [env FLAGPOST_WRITE_STALL_TIMEOUT_MS, default 30000]
    #[argh(option)]
    write_stall_timeout_ms: Option<u64>,
    /// events per second per distinct id before spike routing to the overflow lane [env FLAGPOST_OVERFLOW_RATE, default 100]
    #[argh(option)]
    overflow_rate: Option<f64>,
    /// burst allowed above that rate [env FLAGPOST_OVERFLOW_BURST, default 1000]
    #[argh(option)]
    overflow_burst: Option<f64>,
    /// days to keep events, 0 for ever [env FLAGPOST_RETENTION_DAYS, default 365]
    #[argh(option)]
    retention_days: Option<u32>,
    /// the compactor thread's nice value, 0 to 19: above 0 requests come first when the cores are busy [env FLAGPOST_COMPACTOR_NICE, default 10]
    #[argh(option)]
    compactor_nice: Option<i32>,
    /// memory in MiB for the tables' recent changes together, past which the largest is folded into its files; 0 for no bound [env FLAGPOST_DELTA_BUDGET_MB, default 48]
    #[argh(option)]
    delta_budget_mb: Option<u64>,
    /// city database for GeoIP, MMDB format [env FLAGPOST_GEOIP, default <data dir>/GeoLite2-City.mmdb if present]
    #[argh(option)]
    geoip: Option<PathBuf>,
    /// comma-separated proxies (IPs or CIDRs) whose X-Forwarded-For is believed [env FLAGPOST_TRUSTED_PROXIES, default 127.0.0.1,::1]
    #[argh(option)]
    trusted_proxies: Option<String>,
    /// the URL clients reach this server at, e.g. https://flags.example.com: the base of next/previous links [env FLAGPOST_PUBLIC_URL, default the request's Host when it is one of the listener's names]
    #[argh(option)]
    public_url: Option<String>,
    /// free disk space in MiB below which new events get 503 [env FLAGPOST_MIN_FREE_DISK_MB, default 256]
    #[argh(option)]
    min_free_disk_mb: Option<u64>,
    /// write-ahead log size in MiB past which new events get 503 until the compactor catches up; 0 for no bound [env FLAGPOST_MAX_LOG_MB, default 2048]
    #[argh(option)]
    max_log_mb: Option<u64>,
    /// database page cache in MiB; sled uses more than this [env FLAGPOST_CACHE_MB, default 2]
    #[argh(option)]
    cache_mb: Option<u64>,
    /// size of the write-ahead log's segment files in MiB [env FLAGPOST_LOG_SEGMENT_MB, default 16]
    #[argh(option)]
    log_segment_mb: Option<u64>,
    /// posthog-js's dist/ files, served at /static/ [env FLAGPOST_STATIC_DIR, default <data dir>/static if present]
    #[argh(option)]
    static_dir: Option<PathBuf>,
    /// the web console at /console/: on or off [env FLAGPOST_CONSOLE, default on]
    #[argh(option)]
    console: Option<String>,
    /// copy events, persons and groups into ClickHouse at this http://HOST:PORT; off by default [env FLAGPOST_CLICKHOUSE_URL]
    #[argh(option)]
    clickhouse_url: Option<String>,
    /// the ClickHouse database, created if missing [env FLAGPOST_CLICKHOUSE_DATABASE, default default]
    #[argh(option)]
    clickhouse_database: Option<String>,
    /// the ClickHouse user [env FLAGPOST_CLICKHOUSE_USER, default default]
    #[argh(option)]
    clickhouse_user: Option<String>,
    /// file holding the ClickHouse password [env FLAGPOST_CLICKHOUSE_PASSWORD_FILE]; the password itself may be in env FLAGPOST_CLICKHOUSE_PASSWORD, never a flag
    #[argh(option)]
    clickhouse_password_file: Option<PathBuf>,
    /// edge mode: the PostHog this server stands in front of, e.g. https://eu.i.posthog.com (or another flagpost); off by default [env FLAGPOST_UPSTREAM]
    #[argh(option)]
    upstream: Option<String>,
    /// edge mode: seconds between polls of each synced project's flag definitions; 30s, 5m also read [env FLAGPOST_UPSTREAM_POLL, default 30]
    #[argh(option)]
    upstream_poll: Option<String>,
    /// edge mode: events older than this many seconds are forwarded as historical_migration; 24h also read [env FLAGPOST_UPSTREAM_HISTORICAL_AFTER, default 86400]
    #[argh(option)]
    upstream_historical_after: Option<String>,
    /// edge mode: bytes of events not yet forwarded past which capture answers 503; 512M, 4G also read [env FLAGPOST_UPSTREAM_MAX_BACKLOG, default until the disk reserve]
    #[argh(option)]
    upstream_max_backlog: Option<String>,
    /// edge mode: milliseconds /decide and /flags wait on upstream for a flag the edge cannot decide [env FLAGPOST_UPSTREAM_FLAGS_BUDGET_MS, default 1500]
    #[argh(option)]
    upstream_flags_budget_ms: Option<u64>,
}

impl Cli {
    /// The server logs what it does; the offline commands print their own report and
    /// log only errors.
    pub fn default_log_level(&self) -> &'static str {
        match self.command {
            Some(Command::Serve(_)) => "info",
            _ => "error",
        }
    }
}

/// A flag, else its environment variable, else nothing.
fn or_env<T: std::str::FromStr>(flag: Option<T>, var: &str) -> Result<Option<T>, String> {
    if flag.is_some() {
        return Ok(flag);
    }
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{var}={v:?} is not valid")),
        _ => Ok(None),
    }
}

/// `--flags-dir`, else `FLAGPOST_FLAGS_DIR`, else `<data dir>/flags`.
fn flags_dir(flag: Option<PathBuf>, data_dir: &std::path::Path) -> Result<PathBuf, String> {
    Ok(or_env(flag, "FLAGPOST_FLAGS_DIR")?.unwrap_or_else(|| data_dir.join("flags")))
}

/// A timeout in milliseconds from its flag or `FLAGPOST_<name>`; zero would refuse
/// every request, so it is an error.
fn timeout(flag: Option<u64>, name: &str) -> Result<Option<Duration>, String> {
    match or_env(flag, &format!("FLAGPOST_{name}"))? {
        Some(0) => Err(format!(
            "--{} must be at least 1",
            name.to_ascii_lowercase().replace('_', "-")
        )),
        ms => Ok(ms.map(Duration::from_millis)),
    }
}

pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        None => Err("no command given; try `flagpost serve` or `flagpost --help`".into()),
        Some(Command::Check(args)) => check(args),
        Some(Command::Backup(args)) => backup::backup(args),
        Some(Command::Restore(args)) => backup::restore(args),
        Some(Command::Eval(args)) => tools::eval(args),
        Some(Command::Export(args)) => export(args),
        Some(Command::Key(args)) => tools::key(args),
        Some(Command::Serve(args)) => {
            let config = serve_config(args)?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(flagpost::support::idle::idle)
                .build()
                .map_err(|e| format!("cannot start the runtime: {e}"))?
                .block_on(flagpost::run(config))
                .map_err(|e| e.to_string())
        }
    }
}

fn serve_config(args: Serve) -> Result<Config, String> {
    let sink = sink_settings(&args)?;
    let upstream = upstream::settings(&args)?;
    let data_dir = or_env(args.data_dir, "FLAGPOST_DATA_DIR")?.unwrap_or_else(|| "data".into());
    let db = or_env(args.db, "FLAGPOST_DB")?.unwrap_or_else(|| "var/db".into());
    let mut config = Config::new(data_dir, db);
    config.flags_dir = or_env(args.flags_dir, "FLAGPOST_FLAGS_DIR")?;
    if let Some(listen) = or_env(args.listen, "FLAGPOST_LISTEN")? {
        config.listen = listen
            .parse()
            .map_err(|_| format!("--listen {listen:?} is not an address like 127.0.0.1:8000"))?;
    }
    let limits = &mut config.limits;
    limits.max_body_bytes = or_env(args.max_body_bytes, "FLAGPOST_MAX_BODY_BYTES")?
        .unwrap_or(config::DEFAULT_MAX_BODY_BYTES);
    limits.max_decompressed_bytes = or_env(
        args.max_decompressed_bytes,
        "FLAGPOST_MAX_DECOMPRESSED_BYTES",
    )?
    .unwrap_or(config::DEFAULT_MAX_DECOMPRESSED_BYTES);
    limits.max_connections = or_env(args.max_connections, "FLAGPOST_MAX_CONNECTIONS")?
        .unwrap_or(config::DEFAULT_MAX_CONNECTIONS);
    limits.max_connections_per_address = or_env(
        args.max_connections_per_address,
        "FLAGPOST_MAX_CONNECTIONS_PER_ADDRESS",
    )?;
    if let Some(t) = timeout(args.header_read_timeout_ms, "HEADER_READ_TIMEOUT_MS")? {
        limits.header_read_timeout = t;
    }
    if let Some(t) = timeout(args.body_read_timeout_ms, "BODY_READ_TIMEOUT_MS")? {
        limits.body_read_timeout = t;
    }
    if let Some(t) = timeout(args.write_stall_timeout_ms, "WRITE_STALL_TIMEOUT_MS")? {
        limits.write_stall_timeout = t;
    }
    let compactor = &mut config.compactor;
    if let Some(rate) = or_env(args.overflow_rate, "FLAGPOST_OVERFLOW_RATE")? {
        compactor.overflow_rate = rate;
    }
    if let Some(burst) = or_env(args.overflow_burst, "FLAGPOST_OVERFLOW_BURST")? {
        compactor.overflow_burst = burst;
    }
    if let Some(days) = or_env(args.retention_days, "FLAGPOST_RETENTION_DAYS")? {
        compactor.retention_days = days;
    }
    if let Some(nice) = or_env(args.compactor_nice, "FLAGPOST_COMPACTOR_NICE")? {
        compactor.nice = nice.clamp(0, 19);
    }
    if let Some(mb) = or_env(args.delta_budget_mb, "FLAGPOST_DELTA_BUDGET_MB")? {
        compactor.delta_budget_bytes = mb.saturating_mul(1024 * 1024);
    }
    config.geoip = or_env(args.geoip, "FLAGPOST_GEOIP")?;
    config.static_dir = or_env(args.static_dir, "FLAGPOST_STATIC_DIR")?;
    if let Some(mb) = or_env(args.min_free_disk_mb, "FLAGPOST_MIN_FREE_DISK_MB")? {
        config.min_free_disk_bytes = mb.saturating_mul(1024 * 1024);
    }
    if let Some(mb) = or_env(args.max_log_mb, "FLAGPOST_MAX_LOG_MB")? {
        config.max_log_bytes = mb.saturating_mul(1024 * 1024);
    }
    if let Some(mb) = or_env(args.cache_mb, "FLAGPOST_CACHE_MB")? {
        config.cache_bytes = mb.max(1).saturating_mul(1024 * 1024);
    }
    if let Some(mb) = or_env(args.log_segment_mb, "FLAGPOST_LOG_SEGMENT_MB")? {
        config.log_segment_bytes = mb.clamp(1, 1024).saturating_mul(1024 * 1024);
    }
    if let Some(list) = or_env(args.trusted_proxies, "FLAGPOST_TRUSTED_PROXIES")? {
        config.trusted_proxies =
            flagpost::geoip::TrustedProxies::parse(&list).map_err(|e| e.to_string())?;
    }
    if let Some(url) = or_env(args.public_url, "FLAGPOST_PUBLIC_URL")? {
        config.public_url = Some(flagpost::http::links::public_url(&url)?);
    }
    config.console = match or_env(args.console, "FLAGPOST_CONSOLE")?.as_deref() {
        None | Some("on") => true,
        Some("off") => false,
        Some(other) => return Err(format!("--console {other:?} must be on or off")),
    };
    config.upstream = upstream;
    // The sink and the forwarder both read what the compactor commits from the outbox.
    config.compactor.outbox = sink.is_some() || config.upstream.is_some();
    config.sink = sink;
    Ok(config)
}

/// The ClickHouse sink's settings if a URL is given; the password comes from the
/// environment or a file only.
fn sink_settings(args: &Serve) -> Result<Option<config::Sink>, String> {
    let Some(url) = or_env(args.clickhouse_url.clone(), "FLAGPOST_CLICKHOUSE_URL")? else {
        return Ok(None);
    };
    let mut settings = config::Sink::new(&url);
    if let Some(db) = or_env(
        args.clickhouse_database.clone(),
        "FLAGPOST_CLICKHOUSE_DATABASE",
    )? {
        settings.database = db;
    }
    if let Some(user) = or_env(args.clickhouse_user.clone(), "FLAGPOST_CLICKHOUSE_USER")? {
        settings.user = user;
    }
    let file = or_env(
        args.clickhouse_password_file.clone(),
        "FLAGPOST_CLICKHOUSE_PASSWORD_FILE",
    )?;
    settings.password = flagpost::sink::read_password(file.as_deref())
        .map_err(|e| format!("--clickhouse-password-file: {e}"))?;
    settings.authority().map_err(|e| e.to_string())?;
    Ok(Some(settings))
}

fn check(args: Check) -> Result<(), String> {
    if let Some(db) = &args.db {
        return flagpost::store::check::run(db);
    }
    let data_dir = or_env(args.data_dir, "FLAGPOST_DATA_DIR")?.unwrap_or_else(|| "data".into());
    let flags_dir = flags_dir(args.flags_dir, &data_dir)?;
    let geoip = or_env(args.geoip, "FLAGPOST_GEOIP")?;
    let report = flagpost::admin::check(&data_dir, &flags_dir, geoip.as_deref());
    let mut out = Stdout::default();
    for note in &report.notes {
        out.line(format_args!("ok: {note}"))?;
    }
    for warning in &report.warnings {
        out.line(format_args!("warning: {warning}"))?;
    }
    for error in &report.errors {
        out.line(format_args!("error: {error}"))?;
    }
    match report.errors.len() {
        0 => Ok(()),
        n => Err(format!("{} has {n} error(s)", data_dir.display())),
    }
}

fn export(args: Export) -> Result<(), String> {
    let db = or_env(args.db, "FLAGPOST_DB")?.unwrap_or_else(|| "var/db".into());
    let mut progress = Progress::new();
    let count = match &args.output {
        Some(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            let mut out = std::io::BufWriter::new(file);
            flagpost::admin::export(&db, &mut out, |d, t| progress.show(d, t))
        }
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            flagpost::admin::export(&db, &mut out, |d, t| progress.show(d, t))
        }
    };
    let count = match count {
        // The reader stopped reading (`flagpost export | head`): done, quietly.
        Err(flagpost::admin::ExportError::Write(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            return Ok(())
        }
        other => other.map_err(|e| e.to_string())?,
    };
    progress.finish(count);
    Ok(())
}

/// Standard output for a command's report. A closed pipe (`flagpost check | head`)
/// stops the output quietly, as with other command-line tools; the command still
/// finishes and exits with its own status.
#[derive(Default)]
struct Stdout {
    closed: bool,
}

impl Stdout {
    fn line(&mut self, text: std::fmt::Arguments<'_>) -> Result<(), String> {
        self.write(format_args!("{text}\n"))
    }

    fn write(&mut self, text: std::fmt::Arguments<'_>) -> Result<(), String> {
        use std::io::Write;
        if self.closed {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        match out.write_fmt(text).and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other.map_err(|e| format!("cannot write to standard output: {e}")),
        }
    }
}

/// A progress bar on stderr: redrawn in place at a terminal, a line per tenth otherwise
/// (so a log file is not flooded).
struct Progress {
    tty: bool,
    last: std::time::Instant,
    last_tenth: u64,
}

impl Progress {
    /// Redraws at most this often.
    const EVERY: std::time::Duration = std::time::Duration::from_millis(100);
    const WIDTH: u64 = 30;

    fn new() -> Progress {
        Progress {
            tty: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            last: std::time::Instant::now(),
            last_tenth: 0,
        }
    }

    fn show(&mut self, done: u64, total: u64) {
        let total = total.max(1);
        let done = done.min(total);
        if self.tty {
            if self.last.elapsed() < Self::EVERY && done < total {
                return;
            }
            self.last = std::time::Instant::now();
            let filled = done * Self::WIDTH / total;
            eprint!(
                "\r[{}{}] {:>3}% {done}/{total} events",
                "#".repeat(filled as usize),
                " ".repeat((Self::WIDTH - filled) as usize),
                done * 100 / total
            );
        } else {
            let tenth = done * 10 / total;
            if tenth > self.last_tenth {
                self.last_tenth = tenth;
                eprintln!("export: {}% ({done}/{total} events)", tenth * 10);
            }
        }
    }

    fn finish(&self, count: u64) {
        if self.tty {
            eprintln!();
        }
        eprintln!("export: {count} events written");
    }
}
