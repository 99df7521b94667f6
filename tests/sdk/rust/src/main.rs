//! Drive the official Rust client, posthog-rs, unchanged against a flagpost server and
//! print one JSON summary of what it did on stdout.
//!
//!     posthog-rs-driver HOST PROJECT_KEY PERSONAL_KEY PREFIX
//!
//! One cargo feature selects the client build: `async` (the crate's default
//! features: the async client, V0 capture), `blocking` (default features off: the
//! blocking client) or `v1` (the async client with `capture-v1`). The client talks to
//! HOST through a recording pass-through ([`proxy`]), so the summary holds every
//! request and response, with the events in each. Distinct ids start with PREFIX.
//! A call that fails is reported as `{"error": …}` in place of its value, so one run
//! shows every failure at once.

use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use posthog_rs::{CaptureCompression, CaptureExceptionOptions, ClientOptionsBuilder, Event};
use serde_json::{json, Map, Value};

#[cfg(not(any(feature = "async", feature = "blocking", feature = "v1")))]
compile_error!("build with one of the features `async`, `blocking`, `v1`");

#[cfg(feature = "blocking")]
const BUILD: &str = "blocking";
#[cfg(feature = "v1")]
const BUILD: &str = "v1";
#[cfg(all(feature = "async", not(feature = "v1")))]
const BUILD: &str = "async";

/// `.await` in the async builds, nothing in the blocking one: the scenario is
/// written once for both client APIs, as `async` functions that in the blocking
/// build never wait (see `main`).
#[cfg(not(feature = "blocking"))]
macro_rules! w {
    ($e:expr) => {
        $e.await
    };
}
#[cfg(feature = "blocking")]
macro_rules! w {
    ($e:expr) => {
        $e
    };
}

mod flags;
mod proxy;

pub async fn pause(d: Duration) {
    #[cfg(not(feature = "blocking"))]
    tokio::time::sleep(d).await;
    #[cfg(feature = "blocking")]
    std::thread::sleep(d);
}

type Errors = Arc<Mutex<Vec<String>>>;

pub fn result<T: serde::Serialize, E: std::fmt::Display>(r: Result<T, E>) -> Value {
    match r {
        Ok(v) => serde_json::to_value(v).unwrap_or_else(|e| json!({ "error": e.to_string() })),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

async fn client(
    host: &str,
    key: &str,
    errors: &Errors,
    tune: impl FnOnce(&mut ClientOptionsBuilder),
) -> posthog_rs::Client {
    let mut b = ClientOptionsBuilder::default();
    b.api_key(key.to_string())
        .host(host)
        .request_timeout_seconds(10)
        .feature_flags_request_timeout_seconds(10);
    let sink = errors.clone();
    b.on_error(move |e: &posthog_rs::PostHogError<'_>| sink.lock().unwrap().push(format!("{e:?}")));
    tune(&mut b);
    let options = b.build().expect("client options");
    w!(posthog_rs::client(options))
}

async fn scenario(host: &str, key: &str, personal: &str, prefix: &str, log: &proxy::Log) -> Value {
    let (user, anon, stranger) = (
        format!("{prefix}-user"),
        format!("{prefix}-anon"),
        format!("{prefix}-stranger"),
    );
    let company = format!("{prefix}-acme");
    let errors: Errors = Arc::default();
    let mut ids = Map::new();
    let mut event = |name: &str, distinct_id: &str, properties: &[(&str, Value)]| {
        let mut e = Event::new(name, distinct_id);
        for (k, v) in properties {
            e.insert_prop(*k, v).expect("a JSON property");
        }
        let id = uuid::Uuid::now_v7();
        e.set_uuid(id);
        ids.insert(name.to_string(), json!(id.to_string()));
        e
    };

    // Capture: one event with its own timestamp, the person's properties, an
    // alias, a group, an event in that group, a batch, an exception.
    let plain = client(host, key, &errors, |_| {}).await;
    let mut signup = event("signed up", &anon, &[("step", json!(1))]);
    let signed_up_at = chrono::Utc::now() - chrono::Duration::minutes(3);
    signup.set_timestamp(signed_up_at).expect("a timestamp");
    plain.capture(signup);
    let set = event(
        "$set",
        &user,
        &[(
            "$set",
            json!({"plan": "pro", "email": format!("{user}@example.com")}),
        )],
    );
    plain.capture(set);
    plain.alias(anon.as_str(), user.as_str());
    plain
        .group_identify(
            "company",
            company.as_str(),
            json!({"seats": 50, "name": "Acme"}),
        )
        .expect("group properties");
    let mut order = event("order placed", &user, &[("amount", json!(30))]);
    order.add_group("company", &company);
    plain.capture(order);
    let batch = vec![
        event("batch one", &user, &[("n", json!(1))]),
        event("batch two", &anon, &[("n", json!(2))]),
    ];
    plain.capture_batch(batch, false);
    let failure = std::io::Error::other("checkout failed");
    let exception = CaptureExceptionOptions::new()
        .distinct_id(user.as_str())
        .property("route", "/checkout")
        .expect("a property");
    let exception = w!(plain.capture_exception_with(&failure, exception));
    w!(plain.flush());

    // The same with gzip.
    let zipped = client(host, key, &errors, |b| {
        b.capture_compression(CaptureCompression::Gzip);
    })
    .await;
    zipped.capture(event("gzipped", &user, &[("n", json!(2))]));
    w!(zipped.flush());

    // Remote evaluation, once the server has the person and group properties.
    let who = flags::Who {
        user: user.clone(),
        stranger,
        company,
        prefix: prefix.to_string(),
    };
    let remote = flags::remote(&plain, &who).await;

    // Local evaluation from the definitions feed, polled every second: the
    // first poll after the initial load gets the ETag, the next sends it back.
    let polls = |log: &proxy::Log| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/flags/definitions"))
            })
            .count()
    };
    let before = polls(log);
    let local = client(host, key, &errors, |b| {
        b.secret_key(personal)
            .enable_local_evaluation(true)
            .local_evaluation_only(true)
            .poll_interval_seconds(1);
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while polls(log) < before + 3 && Instant::now() < deadline {
        pause(Duration::from_millis(100)).await;
    }
    let local_values = flags::local(&local, &who).await;

    // Deliver everything, then stop the background workers and the poller.
    for c in [&plain, &zipped, &local] {
        w!(c.flush());
        w!(c.shutdown());
    }
    drop(local);

    let errors = errors.lock().unwrap().clone();
    json!({
        "sdk": "posthog-rs",
        "version": "0.30.0",
        "build": BUILD,
        "ids": ids,
        "signed_up_at": signed_up_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "exception": result(exception),
        "remote": remote,
        "local": local_values,
        "errors": errors,
        "requests": log.lock().unwrap().clone(),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, key, personal, prefix] = &args[..] else {
        eprintln!("usage: posthog-rs-driver HOST PROJECT_KEY PERSONAL_KEY PREFIX");
        std::process::exit(2);
    };
    let authority = host
        .strip_prefix("http://")
        .expect("an http:// host")
        .trim_end_matches('/');
    let upstream = authority
        .to_socket_addrs()
        .expect("a host:port")
        .next()
        .expect("an address");
    let (addr, log) = proxy::start(upstream);
    let through = format!("http://{addr}");
    #[cfg(not(feature = "blocking"))]
    let summary = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(scenario(&through, key, personal, prefix, &log));
    // The blocking client's calls return when done, so the scenario is ready on its
    // first poll: no runtime, which the blocking client must not run inside.
    #[cfg(feature = "blocking")]
    let summary = {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let mut run = std::pin::pin!(scenario(&through, key, personal, prefix, &log));
        match run.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(summary) => summary,
            Poll::Pending => panic!("the blocking scenario waited on a future"),
        }
    };
    println!("{summary}");
}
