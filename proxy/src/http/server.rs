//! The HTTP server loop: accept, one task per connection (HTTP/1.1 and h2c), graceful drain.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::routes;
use super::App;

/// How long answers given at the end of the grace period get to reach their clients.
const FLUSH: Duration = Duration::from_secs(2);

/// Serves until `stop` is cancelled, then stops accepting and lets open requests finish for up
/// to `grace`. If that runs out, `expired` is cancelled (whoever holds the remaining jobs answers
/// them) and the answers get [`FLUSH`] to go out.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    stop: CancellationToken,
    grace: Duration,
    expired: CancellationToken,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Typically out of file descriptors: back off a little and keep serving.
                    warn!(error = %e, "could not accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        // Small answers go out at once rather than waiting for Nagle's timer.
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = service_fn(move |request| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(routes::route(&app, request).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    info!("no longer accepting HTTP connections; draining open requests");
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(grace, &mut drained).await.is_err() {
        warn!("the grace period ran out; answering what is left 503");
        expired.cancel();
        let _ = tokio::time::timeout(FLUSH, drained).await;
    }
}
