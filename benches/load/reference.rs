//! The reference server: the least an HTTP/1 server built on the same hyper and tokio
//! as flagpost can do per request (read the whole body, answer `200 {"status":1}`), so
//! the ratio shows what flagpost's own work costs on this machine.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// The body flagpost answers an accepted capture with.
const OK_BODY: &[u8] = br#"{"status":1}"#;

/// Serve on a fresh loopback port until SIGTERM, on a runtime built like flagpost's.
pub fn run() -> std::io::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve())
}

async fn serve() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let mut term = signal(SignalKind::terminate())?;
    eprintln!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = term.recv() => return Ok(()),
        };
        // flagpost sets this too; without it small answers wait on Nagle's algorithm.
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let read = request.into_body().collect().await;
    let status = if read.is_ok() { 200 } else { 400 };
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(OK_BODY)))
        .expect("static response parts are valid");
    Ok(response)
}
