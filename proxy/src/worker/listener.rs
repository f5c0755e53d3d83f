//! The Unix socket workers connect to.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::worker::connection;

/// Binds the worker socket. A socket file left behind by a proxy that died is replaced; one that a
/// live proxy still answers on is an error, so two proxies never share a path by accident; and a
/// path that is not a socket at all is never deleted. The socket gets permissions `mode`
/// (owner-only by default): whoever can connect sees every payload.
pub async fn bind(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; refusing to replace it", path.display()),
            ));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by another process", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Accepts worker connections until shutdown; each gets its own task, tracked by `tasks`.
pub async fn accept(listener: UnixListener, context: connection::Context, tasks: TaskTracker) {
    let shutdown = context.shutdown.clone();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Typically out of file descriptors: keep the listener, try again.
                    warn!(error = %e, "could not accept a worker connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        tasks.spawn(connection::serve(stream, context.clone()));
    }
}

/// Removes the socket file at shutdown.
pub fn remove(path: &PathBuf) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            warn!(path = %path.display(), error = %e, "could not remove the worker socket");
        }
    }
}
