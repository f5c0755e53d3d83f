//! A client connection closed while the server drains is closed gracefully ("lingering close"):
//! its write side is shut (the client gets every byte queued, then the end), and what the client
//! still sends is read and thrown away until it closes its side too, or the drain's time is up.
//!
//! Closed outright, a socket with bytes still to read is reset by the kernel, and a reset
//! throws away what was queued for the client as well. hyper ends an HTTP/2 connection once it
//! has handed its last frames to the kernel, while a client reading a large answer slowly still
//! sends `WINDOW_UPDATE`s, and one still uploading sends its body: the 20 MB answer a client was
//! reading at 1 MB/s was cut 2 MB short at every drain, and an upload answered 503 at the end of
//! the grace period never saw its answer. HTTP/1.1 clients send nothing after their request, but
//! are closed the same way.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A client's connection, closed gracefully if it ends once the server drains.
pub struct Lingering {
    stream: Option<TcpStream>,
    draining: CancellationToken,
    closing: TaskTracker,
}

impl Lingering {
    /// `closing` tracks the closes under way, which the server waits for (within its grace
    /// period) before it stops.
    pub fn new(stream: TcpStream, draining: CancellationToken, closing: TaskTracker) -> Self {
        Self { stream: Some(stream), draining, closing }
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("held until dropped"))
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else { return };
        if self.draining.is_cancelled() {
            self.closing.spawn(close(stream));
        }
    }
}

/// Shuts the write side, then reads until the client closes its own (or fails).
async fn close(mut stream: TcpStream) {
    // (hyper may have shut it already: the read below is what matters.)
    let _ = stream.shutdown().await;
    let mut discard = [0u8; 16 * 1024];
    while let Ok(n) = stream.read(&mut discard).await {
        if n == 0 {
            return;
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|stream| stream.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}
