//! The worker side of the proxy: the Unix socket workers connect to, and one task per connected
//! worker that feeds it batches and routes its results back to the waiting jobs.

pub mod connection;
pub mod listener;
