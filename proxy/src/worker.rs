//! The worker side of the proxy: the Unix socket workers connect to, and one task per connected
//! worker that feeds it batches and routes its results back to the waiting jobs: the connection
//! task reads, its outbox writes, and settling answers or hands back the jobs a worker held.

pub mod connection;
pub mod departures;
mod hello;
pub mod listener;
pub mod outbox;
pub mod settle;
pub mod streaming;
mod words;

use corral_protocol::ProxyCodec;
use tokio::net::unix::OwnedReadHalf;
use tokio_util::codec::FramedRead;

/// The reading half of a worker connection.
type Inbox = FramedRead<OwnedReadHalf, ProxyCodec>;
