//! Command-line flags (argh), each with an environment fallback, turned into the
//! library's typed configuration. Flags only validate here; the library builds the
//! real objects.

use std::path::PathBuf;

use argh::FromArgs;
use flagpost::config::{self, Config};

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
enum Command {
    Serve(Serve),
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
    /// events per second per distinct id before spike routing to the overflow lane [env FLAGPOST_OVERFLOW_RATE, default 100]
    #[argh(option)]
    overflow_rate: Option<f64>,
    /// burst allowed above that rate [env FLAGPOST_OVERFLOW_BURST, default 1000]
    #[argh(option)]
    overflow_burst: Option<f64>,
    /// days to keep events, 0 for ever [env FLAGPOST_RETENTION_DAYS, default 365]
    #[argh(option)]
    retention_days: Option<u32>,
    /// city database for GeoIP, MMDB format [env FLAGPOST_GEOIP, default <data dir>/GeoLite2-City.mmdb if present]
    #[argh(option)]
    geoip: Option<PathBuf>,
    /// comma-separated proxies (IPs or CIDRs) whose X-Forwarded-For is believed [env FLAGPOST_TRUSTED_PROXIES, default 127.0.0.1,::1]
    #[argh(option)]
    trusted_proxies: Option<String>,
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

pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        None => Err("no command given; try `flagpost serve` or `flagpost --help`".into()),
        Some(Command::Serve(args)) => {
            let config = serve_config(args)?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the runtime: {e}"))?
                .block_on(flagpost::run(config))
                .map_err(|e| e.to_string())
        }
    }
}

fn serve_config(args: Serve) -> Result<Config, String> {
    let data_dir = or_env(args.data_dir, "FLAGPOST_DATA_DIR")?.unwrap_or_else(|| "data".into());
    let db = or_env(args.db, "FLAGPOST_DB")?.unwrap_or_else(|| "var/db".into());
    let mut config = Config::new(data_dir, db);
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
    config.geoip = or_env(args.geoip, "FLAGPOST_GEOIP")?;
    if let Some(list) = or_env(args.trusted_proxies, "FLAGPOST_TRUSTED_PROXIES")? {
        config.trusted_proxies =
            flagpost::geoip::TrustedProxies::parse(&list).map_err(|e| e.to_string())?;
    }
    Ok(config)
}
