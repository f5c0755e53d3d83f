//! The process's open-file limit and the HTTP connection cap it allows.
//!
//! Every HTTP connection is a file descriptor. If the cap on connections (`--max-connections`,
//! 10 000 by default) is above what the process may open (a soft `RLIMIT_NOFILE` of 1024 is
//! common), `accept` fails with EMFILE once the descriptors run out, and the clients beyond wait
//! in the kernel's backlog with no answer, instead of getting the documented 503. So at start the
//! soft limit is raised to the hard one (allowed without privileges), and the effective cap is
//! kept below the limit, with room left for what else the process opens: its listeners, the
//! runtime's own descriptors, each worker's socket and output pipes, the worker socket's
//! connections yet to say hello ([`crate::worker::listener::AWAITING_HELLO`], and
//! [`crate::worker::listener::WAITING_ROOM`] more waiting a moment for a slot), the workers it
//! did not spawn ([`crate::worker::connection::MAX_EXTERNAL`]), the connection
//! reserve past the cap ([`crate::http::reserve`]), and connections being refused (each holds a
//! descriptor while its 503 is written, and up to 32 of them a second more while what their
//! clients send is read and dropped).

use tracing::{info, warn};

/// Descriptors kept for the process itself beyond the workers' (listeners, runtime, signals,
/// stdio, config and `/proc` reads, and refusals under way).
const RESERVED: u64 = 64;
/// Descriptors per worker: its socket, the stdout and stderr pipes of a spawned one, the handle
/// the supervisor waits on.
const PER_WORKER: u64 = 4;

/// Raises the soft open-file limit as far as the process may and returns the cap on HTTP
/// connections it leaves room for: `requested` or less (logged when less).
pub fn connection_cap(requested: usize, workers: usize) -> usize {
    let Some(limit) = raise_soft_limit() else {
        return requested;
    };
    let cap = cap_under(limit, workers as u64).min(requested as u64) as usize;
    if cap < requested {
        warn!(
            max_connections = requested,
            open_file_limit = limit,
            effective = cap,
            "--max-connections is more than the open-file limit leaves room for; connections \
             past the effective cap are answered 503, but for probes on the connection reserve \
             (raise the hard limit, e.g. `ulimit -Hn`, to allow more)"
        );
    }
    cap
}

/// The connections a process with `limit` descriptors can hold besides its own, its workers'
/// and the connection reserve's. Under a tiny limit, at most half of it is kept for the process
/// and its workers; the reserve's connections are always kept room for, since they are opened
/// whenever the cap is reached.
fn cap_under(limit: u64, workers: u64) -> u64 {
    let awaiting_hello =
        (crate::worker::listener::AWAITING_HELLO + crate::worker::listener::WAITING_ROOM) as u64;
    // A worker Corral did not spawn holds its socket alone.
    let external = crate::worker::connection::MAX_EXTERNAL as u64;
    let kept = (RESERVED + awaiting_hello + external + PER_WORKER * workers).min(limit / 2);
    let reserve = crate::http::reserve::CONNECTIONS as u64;
    limit.saturating_sub(kept).saturating_sub(reserve).max(1)
}

/// The soft limit as the proxy started, if it raised it.
static BEFORE: std::sync::OnceLock<libc::rlim_t> = std::sync::OnceLock::new();

/// The soft open-file limit the proxy started with, if it raised its own: what the workers it
/// spawns get back (a program that closes every descriptor up to its limit at start, or sizes
/// a table by it, should not pay for the proxy's connections).
pub fn soft_limit_before() -> Option<libc::rlim_t> {
    BEFORE.get().copied()
}

/// Sets the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit in force after, or
/// None if it cannot be read (or is unlimited).
fn raise_soft_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        warn!(error = %std::io::Error::last_os_error(), "cannot read the open-file limit");
        return None;
    }
    let hard = if limit.rlim_max == libc::RLIM_INFINITY {
        // An unlimited hard limit still stops at the kernel's per-process maximum.
        match std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            Some(most) => most,
            None => return (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur),
        }
    } else {
        limit.rlim_max
    };
    if limit.rlim_cur < hard {
        let raised = libc::rlimit { rlim_cur: hard, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            info!(from = limit.rlim_cur, to = hard, "raised the open-file limit");
            let _ = BEFORE.set(limit.rlim_cur);
            return Some(hard);
        }
        warn!(error = %std::io::Error::last_os_error(), "cannot raise the open-file limit");
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// An accept loop's failures (out of descriptors, typically), logged at most once a minute with
/// how many were not: the loop retries every 50 ms, and logged each time it wrote 450 warnings
/// in 13 s while the descriptors stayed used up. An accept between failures does not start the
/// minute again: a client alternating a refused and an accepted connection had a warning logged
/// for each refusal (300 in 2.6 s).
/// How often a run of accept failures is written to the log, at most.
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Default)]
pub struct AcceptFailures {
    /// When the last warning was written.
    logged: Option<std::time::Instant>,
    /// A warning was written and no accept has said the failures ended since.
    open: bool,
    unlogged: u64,
}

impl AcceptFailures {
    pub fn failed(&mut self, what: &str, error: &std::io::Error) {
        if self.logged.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            self.unlogged += 1;
            return;
        }
        warn!(
            %error,
            failed_since = self.unlogged,
            "could not accept {what} (logged at most once a minute; failed_since counts the \
             failures not logged since the last line)"
        );
        self.logged = Some(std::time::Instant::now());
        self.open = true;
        self.unlogged = 0;
    }

    /// A connection was accepted: after a warning, says so once, with the failures not logged,
    /// so that a burst that ended is not left looking as if it went on. Failures after that
    /// line wait for the minute: the next warning counts them, or, if none comes, an accept
    /// past the minute says how many there were (once a minute, too).
    pub fn accepted(&mut self, what: &str) {
        let open = std::mem::take(&mut self.open);
        if !open && self.unlogged == 0 {
            return; // the usual accept: nothing to say, no clock read
        }
        let due = self.logged.is_some_and(|at| at.elapsed() >= LOG_EVERY);
        if open || (self.unlogged > 0 && due) {
            info!(failed_since = self.unlogged, "accepting {what} again");
            self.unlogged = 0;
            if due {
                self.logged = Some(std::time::Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_process_and_its_workers() {
        let hello = 32 + 96; // the worker socket's connections yet to say hello, and waiting
        let external = 128; // workers it did not spawn
        let kept = 64 + hello + external;
        assert_eq!(cap_under(1024, 1), 1024 - kept - 4 - 16, "16: the connection reserve");
        assert_eq!(cap_under(1_048_576, 8), 1_048_576 - kept - 32 - 16);
        assert_eq!(cap_under(64, 1), 16, "a tiny limit: half of it, less the reserve");
        assert_eq!(cap_under(1, 1), 1);
    }

    #[test]
    fn the_cap_is_never_above_the_flag() {
        assert_eq!(connection_cap(2, 1), 2);
    }

    #[test]
    fn accept_failures_are_logged_once_a_minute_and_counted_between() {
        let mut failures = AcceptFailures::default();
        let error = std::io::Error::from_raw_os_error(libc::EMFILE);
        failures.failed("a test connection", &error);
        assert!(failures.logged.is_some());
        for _ in 0..3 {
            failures.failed("a test connection", &error);
        }
        assert_eq!(failures.unlogged, 3, "not logged within the minute, counted");
        failures.logged = Some(std::time::Instant::now() - std::time::Duration::from_secs(61));
        failures.failed("a test connection", &error);
        assert_eq!(failures.unlogged, 0, "logged again a minute on, the count with it");
        failures.failed("a test connection", &error);
        failures.accepted("test connections");
        assert!(!failures.open && failures.unlogged == 0, "said once, and reset");
        // A client alternating refused and accepted connections: no line until the minute is up.
        for _ in 0..300 {
            failures.failed("a test connection", &error);
            failures.accepted("test connections");
        }
        assert_eq!(failures.unlogged, 300, "counted for the next line, not logged");
        // If no failure comes after the minute, an accept then says how many there were.
        let mut quiet = AcceptFailures { unlogged: 300, ..AcceptFailures::default() };
        quiet.logged = Some(std::time::Instant::now() - std::time::Duration::from_secs(61));
        quiet.accepted("test connections");
        assert_eq!(quiet.unlogged, 0, "said, with its count");
        failures.logged = Some(std::time::Instant::now() - std::time::Duration::from_secs(61));
        failures.failed("a test connection", &error);
        assert!(failures.open && failures.unlogged == 0, "logged with the count a minute on");
    }
}
