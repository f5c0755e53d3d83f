//! A spawned worker's stdout and stderr, copied to Corral's own one prefixed line at a time.
//!
//! The pipe is read as bytes until the worker closes it, whatever it writes: text that is not
//! UTF-8 is forwarded lossily (U+FFFD for each bad sequence) rather than ending the copy, because
//! a pipe nobody reads any more breaks the worker (`BrokenPipeError`, or SIGPIPE for a worker in
//! C++) at its next write. A line is at most [`MAX_LINE`] bytes: a longer run (a `\r` progress bar
//! never ends its line) is cut into pieces, each forwarded with the prefix, so memory stays bounded
//! whatever the worker prints.
//!
//! With `--log-format json` ([`as_json`]) each line is a JSON object as the proxy's own log lines
//! are (`timestamp`, `level`, `message`, `target`, and the `worker`, its `stage` and `stream`): a
//! log collector that parses one object per line would otherwise meet plain text among them.
//!
//! Lines are never written on the runtime's threads: a stdout nobody reads (a log driver that
//! fell behind, a paused `| less`) blocked each forwarding task in `write`, holding the stdout
//! lock, until no runtime thread was left to serve requests or take a stop signal. A thread of
//! its own writes them ([`WRITER`]), fed by a queue of [`QUEUED_LINES`] and [`QUEUED_BYTES`]
//! (counted as written: a piece of `\r`-separated output becomes many prefixed lines, and a
//! control byte six escaped ones, so a bound on pieces alone let a 160-character stage name
//! hold 735 MB). A forwarding task that finds the queue full waits for room without holding a
//! thread, and stops reading its worker's pipe meanwhile, so a worker printing faster than our
//! stdout is read waits in its own `write`, as any process writing to a full pipe does, and no
//! line is lost while the queue, once full, drains to half within [`stall`] (half a second with
//! the automatic `--batch-timeout-ms`, half the shortest set one, a second at most). One that
//! does not means our stdout is not read, or read
//! slower than workers write (a log driver stuck or behind, a paused `| less`): from then until
//! it drains to half, a line that finds no room at once is
//! dropped and counted (`corral_log_lines_dropped_total{source="worker"}`, and a warning, at
//! most one a minute, once lines flow again), and the pipe is read on. Waiting without end had
//! lost no line, but a worker that logs as it works then blocked mid-batch past
//! `--batch-timeout-ms`: killed as hung, its jobs run again, restarted to block again, while
//! the proxy's own lines saying so were dropped. Serving comes before logs. The proxy's own log
//! lines go through [`log_writer`] (tracing-appender's non-blocking writer: a thread of its own,
//! and a line that finds its queue full is dropped, counted as `source="proxy"`: a log call
//! cannot wait).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tracing::warn;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

use tokio::io::{AsyncRead, AsyncReadExt};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

use crate::metrics::metrics;

/// Whether workers' lines are written as JSON objects.
static JSON: AtomicBool = AtomicBool::new(false);

/// The thread that writes workers' lines, and the queue to it (None if it could not start:
/// lines are then written where they are forwarded, as before).
static WRITER: OnceLock<Option<mpsc::Sender<Queued>>> = OnceLock::new();

/// A line on its way to the writer thread: to stderr or not, and the room it holds.
struct Queued {
    stderr: bool,
    line: String,
    room: u32,
}

/// The proxy's own log lines that may wait for their thread before more are dropped.
const LOG_LINES: usize = 4096;

/// Workers' lines that may wait for the writer thread.
const QUEUED_LINES: usize = 1024;
/// The bytes of workers' lines that may wait for the writer thread, as they are written.
const QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Room for [`QUEUED_BYTES`]: taken by a line as it is queued, given back once it is written.
static ROOM: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(QUEUED_BYTES);

/// Lines handed to the writer thread, and lines it has written (or failed to): [`flush`] waits
/// for the second to reach the first.
static SENT: AtomicU64 = AtomicU64::new(0);
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Workers' lines dropped since a warning last said so, and when it last did (milliseconds
/// since [`since_start`]'s start; 0: never).
static UNTOLD: AtomicU64 = AtomicU64::new(0);
static WARNED_AT: AtomicU64 = AtomicU64::new(0);
const WARN_EVERY: Duration = Duration::from_secs(60);

/// How long the queue may stay full before lines are dropped: longer than a reader that keeps
/// up takes to make room, shorter than a batch may take: a second, or half the shortest limit
/// a worker has past its jobs' time ([`bound_stall`]; in milliseconds). A limit set very low
/// (a few milliseconds) drops lines even behind a reader that keeps up.
static STALL_MS: AtomicU64 = AtomicU64::new(1000);

/// Keeps the stall below half of `limit`: a stage's `--batch-timeout-ms`, or, where that is
/// automatic, the margin a worker has past its jobs' route timeout. A worker held in its
/// `write` for the whole second had been killed as hung under a --batch-timeout-ms of 300.
pub fn bound_stall(batch_timeout: Duration) {
    let half = (batch_timeout.as_millis() / 2).max(1) as u64;
    STALL_MS.fetch_min(half, Ordering::AcqRel);
}

fn stall() -> Duration {
    Duration::from_millis(STALL_MS.load(Ordering::Acquire))
}
/// When the queue was last found full with no drain to half since (milliseconds since
/// [`since_start`]'s start, plus one; 0: it has room). Over all workers' lines: one writer
/// thread writes them all.
static FULL_SINCE: AtomicU64 = AtomicU64::new(0);

/// Milliseconds since the first call (a clock the atomics above can hold).
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The proxy's own log lines its writer dropped (tracing-appender counts them).
static PROXY_DROPPED: OnceLock<ErrorCounter> = OnceLock::new();
/// How many of those the metric has been given.
static PROXY_COUNTED: AtomicU64 = AtomicU64::new(0);

/// Brings `corral_log_lines_dropped_total{source="proxy"}` up to the writer's own count: at
/// scrape time, as the gauges are read.
pub fn count_dropped_log_lines() {
    let Some(dropped) = PROXY_DROPPED.get() else { return };
    let now = dropped.dropped_lines() as u64;
    // Two scrapes at once: the one that moves the mark adds the difference, the other nothing.
    let before = PROXY_COUNTED.fetch_max(now, Ordering::AcqRel);
    if now > before {
        metrics().log_lines_dropped.with_label_values(&["proxy"]).inc_by(now - before);
    }
}

fn writer() -> Option<&'static mpsc::Sender<Queued>> {
    WRITER
        .get_or_init(|| {
            let (lines, mut queued) = mpsc::channel::<Queued>(QUEUED_LINES);
            let thread =
                std::thread::Builder::new().name("corral-output".into()).spawn(move || {
                    while let Some(Queued { stderr, line, room }) = queued.blocking_recv() {
                        let _ = Standard { stderr }.write_all(line.as_bytes());
                        drop(line);
                        ROOM.add_permits(room as usize);
                        WRITTEN.fetch_add(1, Ordering::Release);
                    }
                });
            thread.ok().map(|_| lines)
        })
        .as_ref()
}

/// Waits, up to `limit`, until the workers' lines handed over so far are written (the last
/// ones, at shutdown, are often the ones that say what went wrong): before the process exits.
pub fn flush(limit: std::time::Duration) {
    let until = std::time::Instant::now() + limit;
    let sent = SENT.load(Ordering::Acquire);
    while WRITTEN.load(Ordering::Acquire) < sent && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5)); // another thread's work: no event
    }
}

/// A writer onto our own stderr that never blocks its caller, for the proxy's log lines, and the
/// guard that lets its last lines out when dropped (1.1 s at most on a stderr that is read; on
/// one that is not, for ever: `main` drops it on a thread of its own).
pub fn log_writer() -> (NonBlocking, WorkerGuard) {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        // The queue is allocated whole at start: tracing-appender's default of 128,000 lines
        // took 4 MB of the proxy's memory for lines that come a few a second at most.
        .buffered_lines_limit(LOG_LINES)
        .thread_name("corral-log")
        .finish(Standard { stderr: true });
    let _ = PROXY_DROPPED.set(writer.error_counter());
    (writer, guard)
}

/// Our own stdout or stderr, as the writer thread uses it: each line written whole (and stdout
/// flushed after it); a line that cannot be written (nobody reads the pipe any more) is dropped.
/// tracing-subscriber reports a failed write with `eprintln!`, which panics on that same closed
/// stderr: `corral … 2>&1 | head -1` once took the proxy down at its next log line.
struct Standard {
    stderr: bool,
}

impl Write for Standard {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let _ = if self.stderr {
            std::io::stderr().lock().write_all(line)
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(line).and_then(|()| out.flush())
        };
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Workers' lines as JSON objects from now on, as `--log-format json` writes the proxy's own.
pub fn as_json() {
    JSON.store(true, Ordering::Relaxed);
}

/// The log format workers are asked to write (`CORRAL_LOG_FORMAT`): `json` where their lines
/// become JSON objects, so that a worker's record keeps its level and traceback together.
pub fn format_name() -> &'static str {
    if JSON.load(Ordering::Relaxed) {
        "json"
    } else {
        "text"
    }
}

/// The longest piece forwarded as one line.
const MAX_LINE: usize = 16 * 1024;
/// How much is read from the pipe at once.
const READ_CHUNK: usize = 64 * 1024;

/// The worker whose output a line is: its stage and index, and the label a text line is
/// prefixed with (`worker N`, or `STAGE worker N`).
pub(super) struct Whose {
    pub label: String,
    pub stage: String,
    pub index: u32,
}

/// Copies a worker's output to ours until the worker closes it (end of file, or a read error).
pub(super) async fn forward(
    mut stream: impl AsyncRead + Unpin,
    label: Arc<Whose>,
    to_stderr: bool,
) {
    let mut lines = Lines::new(MAX_LINE);
    let mut chunk = vec![0; READ_CHUNK];
    let mut ready = Vec::new();
    loop {
        let read = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        lines.push(&chunk[..read], |line| ready.push(prefixed(&label, line, to_stderr)));
        emit(&mut ready, to_stderr).await;
    }
    lines.finish(|line| ready.push(prefixed(&label, line, to_stderr)));
    emit(&mut ready, to_stderr).await;
}

/// One line of a worker's as it is written: prefixed with the worker's label, or a JSON object.
///
/// The line is put together first and written with one `write_all`: `writeln!` on unbuffered
/// stderr makes a system call per piece (`[`, the label, `] `, the text), and where our stdout and
/// stderr share one pipe or file (a container's log, a test harness) another line landed between
/// the pieces.
fn prefixed(whose: &Whose, line: &[u8], to_stderr: bool) -> String {
    let text = String::from_utf8_lossy(line);
    let label = &whose.label;
    if JSON.load(Ordering::Relaxed) {
        json_line(whose, &text, to_stderr)
    } else if text.chars().any(hidden) {
        shown(label, &text)
    } else {
        format!("[{label}] {text}\n")
    }
}

/// A character a terminal acts on rather than shows (a tab is shown as space).
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\t') || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Pushes `c` onto `out`, shown escaped (`\u{1b}`) where a terminal would act on it: for worker
/// output here, and a worker's words Corral logs itself (`worker::connection`).
pub(crate) fn push_shown(out: &mut String, c: char) {
    if hidden(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

/// The length of the colour sequence (`[`, digits and `;`, `m`) that `rest` starts with, after
/// an escape character; None if it is another sequence.
fn colour_sequence(mut rest: impl Iterator<Item = char>) -> Option<usize> {
    if rest.next()? != '[' {
        return None;
    }
    let mut length = 1;
    for c in rest {
        length += 1;
        match c {
            '0'..='9' | ';' => {}
            'm' => return Some(length),
            _ => return None,
        }
    }
    None
}

/// A text line with characters a terminal would act on: shown, not obeyed, since a carriage
/// return or an escape sequence could rewrite the line's prefix, or an earlier line of Corral's.
/// A carriage return ends a line (a progress bar's redraws become lines of their own), colour
/// sequences (`ESC [ … m`) are dropped, and any other such character is shown escaped.
fn shown(label: &str, text: &str) -> String {
    let mut out = String::with_capacity(text.len() + label.len() + 4);
    for piece in text.split('\r').filter(|piece| !piece.is_empty()) {
        out.push_str(&format!("[{label}] "));
        let mut chars = piece.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                if let Some(length) = colour_sequence(chars.clone()) {
                    chars.nth(length - 1); // past the sequence
                    continue;
                }
            }
            push_shown(&mut out, c);
        }
        out.push('\n');
    }
    if out.is_empty() {
        out = format!("[{label}] \n");
    }
    out
}

/// Hands the lines to the writer thread: each at once if the queue has room, else waiting
/// (without a thread) until it has, as long as it has not been full for [`stall`] on end; past
/// that a line that finds no room is dropped (the module's first paragraphs say why). A write
/// error there (our own stdout closed, say) is ignored: the worker's pipe must still be
/// drained, and `println!` would panic and end the copy instead.
async fn emit(ready: &mut Vec<String>, to_stderr: bool) {
    for line in ready.drain(..) {
        let Some(lines) = writer() else {
            let _ = Standard { stderr: to_stderr }.write_all(line.as_bytes());
            continue;
        };
        // A line larger than the whole room needs all of it.
        let room = line.len().min(QUEUED_BYTES) as u32;
        match queue(lines, Queued { stderr: to_stderr, line, room }).await {
            Queueing::Queued => {
                SENT.fetch_add(1, Ordering::Release);
                tell_of_dropped_lines();
            }
            Queueing::Dropped => {
                metrics().log_lines_dropped.with_label_values(&["worker"]).inc();
                UNTOLD.fetch_add(1, Ordering::AcqRel);
            }
            Queueing::NoWriter => {}
        }
    }
}

/// What became of a line handed to the writer thread.
enum Queueing {
    Queued,
    /// The queue had been full for [`stall`].
    Dropped,
    /// The writer thread is gone: nothing will write the line.
    NoWriter,
}

/// Queues `queued` for the writer thread: at once if there is room (the queue drained to half
/// clears its stall), else once there is, up to [`stall`] after the queue was first found full.
async fn queue(lines: &mpsc::Sender<Queued>, queued: Queued) -> Queueing {
    let room = queued.room;
    if let Ok(taken) = ROOM.try_acquire_many(room) {
        match lines.try_reserve() {
            Ok(place) => {
                taken.forget(); // given back by the writer thread once written
                place.send(queued);
                let half = ROOM.available_permits() >= QUEUED_BYTES / 2
                    && lines.capacity() >= QUEUED_LINES / 2;
                if half {
                    FULL_SINCE.store(0, Ordering::Release);
                }
                return Queueing::Queued;
            }
            Err(TrySendError::Closed(())) => return Queueing::NoWriter,
            Err(TrySendError::Full(())) => drop(taken), // its room given back
        }
    }
    let now = since_start() + 1;
    let full_since = match FULL_SINCE.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => now,
        Err(earlier) => earlier,
    };
    // Another forwarder may have set the mark from a later clock read than ours.
    let waited = Duration::from_millis(now.saturating_sub(full_since));
    let Some(left) = stall().checked_sub(waited).filter(|left| !left.is_zero()) else {
        return Queueing::Dropped;
    };
    // One deadline for both waits; each gives up with nothing taken (a room held past the
    // timeout is given back as its permit drops).
    let wait = async {
        let taken = ROOM.acquire_many(room).await.expect("the room is never closed");
        let place = lines.reserve().await?;
        taken.forget();
        place.send(queued);
        Ok::<(), mpsc::error::SendError<()>>(())
    };
    match tokio::time::timeout(left, wait).await {
        Ok(Ok(())) => Queueing::Queued,
        Ok(Err(_)) => Queueing::NoWriter,
        Err(_) => Queueing::Dropped,
    }
}

/// Says how many workers' lines were dropped, once lines flow again, at most once a minute.
fn tell_of_dropped_lines() {
    if UNTOLD.load(Ordering::Acquire) == 0 {
        return;
    }
    let now = since_start() + 1;
    let last = WARNED_AT.load(Ordering::Acquire);
    let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
    if !due || WARNED_AT.compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    let untold = UNTOLD.swap(0, Ordering::AcqRel);
    warn!(
        lines = untold,
        "workers' output dropped: Corral's stdout or stderr was not read as fast as they wrote \
         (corral_log_lines_dropped_total)"
    );
}

/// One line of a worker's as a JSON object, keyed as the proxy's own JSON log lines are. A line
/// that is itself a record as the worker package writes it (`CORRAL_LOG_FORMAT=json`: a JSON
/// object with a `level` and a `message`) keeps its level and its other fields (`logger`, the
/// traceback as `exception`); any other line is an INFO line of text. Every forwarded line was
/// INFO before, a worker's errors among them, and a traceback a line per frame. Its `worker` is
/// the index and `stage` the stage, as in the proxy's own lines about that worker: the label
/// (`"scale worker 1"`) had given one key two types, a string here and a number there, which a
/// log store that fixes a field's type on its first line refused half of.
fn json_line(whose: &Whose, text: &str, to_stderr: bool) -> String {
    let mut timestamp = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let mut line = serde_json::json!({
        "timestamp": timestamp,
        "level": "INFO",
        "message": text,
        "worker": whose.index,
        "stage": whose.stage,
        "stream": if to_stderr { "stderr" } else { "stdout" },
        "target": "corral::worker",
    });
    if let (Some(record), serde_json::Value::Object(fields)) = (worker_record(text), &mut line) {
        fields.extend(record);
    }
    format!("{line}\n")
}

/// The fields a line written as a record by the worker package gives, if it is one: a JSON
/// object with a `logger`, a `message` and a `level` of Python's logging, all strings. Only
/// `level` (as the proxy names levels), `message`, `logger`, `exception` and `stack` are taken:
/// a worker that prints what a client sent must not forge a line's other fields.
fn worker_record(text: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    if !text.starts_with('{') {
        return None;
    }
    let serde_json::Value::Object(mut record) = serde_json::from_str(text).ok()? else {
        return None;
    };
    let text_of = |record: &serde_json::Map<_, _>, key| match record.get(key) {
        Some(serde_json::Value::String(text)) => Some(text.clone()),
        _ => None,
    };
    let level = match text_of(&record, "level")?.as_str() {
        "DEBUG" => "DEBUG",
        "INFO" => "INFO",
        "WARNING" => "WARN",
        "ERROR" | "CRITICAL" => "ERROR",
        _ => return None,
    };
    text_of(&record, "logger")?;
    text_of(&record, "message")?;
    record.retain(|key, value| {
        matches!(key.as_str(), "message" | "logger" | "exception" | "stack") && value.is_string()
    });
    record.insert("level".into(), level.into());
    Some(record)
}

/// Splits bytes into lines of at most `max` bytes (without their `\n`, or `\r\n`), keeping only
/// the unfinished line between pushes.
struct Lines {
    pending: Vec<u8>,
    max: usize,
}

impl Lines {
    fn new(max: usize) -> Self {
        assert!(max >= 4, "a piece must hold at least one UTF-8 character");
        Lines { pending: Vec::new(), max }
    }

    /// Adds bytes; calls `line` for every line they finish and every piece of `max` bytes.
    fn push(&mut self, mut bytes: &[u8], mut line: impl FnMut(&[u8])) {
        while !bytes.is_empty() {
            let room = self.max - self.pending.len();
            let window = &bytes[..bytes.len().min(room)];
            if let Some(end) = window.iter().position(|&b| b == b'\n') {
                self.pending.extend_from_slice(&window[..end]);
                if self.pending.last() == Some(&b'\r') {
                    self.pending.pop();
                }
                line(&self.pending);
                self.pending.clear();
                bytes = &bytes[end + 1..];
                continue;
            }
            self.pending.extend_from_slice(window);
            bytes = &bytes[window.len()..];
            if self.pending.len() == self.max {
                // Cut before a character split by the limit, so that it reaches the next piece
                // whole instead of as two replacement characters.
                let cut = self.max - incomplete_tail(&self.pending);
                line(&self.pending[..cut]);
                self.pending.drain(..cut);
            }
        }
    }

    /// Forwards what is left after the last newline (output that ended without one).
    fn finish(self, mut line: impl FnMut(&[u8])) {
        if !self.pending.is_empty() {
            line(&self.pending);
        }
    }
}

/// How many bytes at the end of `bytes` begin a UTF-8 character that is not complete yet (0 to 3).
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: the character began further back
        }
        let length = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1, // ASCII, or a byte that begins nothing: no character to keep whole
        };
        return if length > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worker `index` of the default stage, as its lines name it.
    fn worker(index: u32) -> Whose {
        Whose { label: format!("worker {index}"), stage: "default".into(), index }
    }

    #[test]
    fn a_json_line_is_one_object_keyed_as_the_proxy_s_own() {
        let scale = Whose { label: "scale worker 1".into(), stage: "scale".into(), index: 1 };
        let line = json_line(&scale, "Traceback \"x\"\t{}", true);
        assert!(line.ends_with('\n') && !line.trim_end().contains('\n'));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["message"], "Traceback \"x\"\t{}");
        assert_eq!((&value["worker"], &value["stream"]), (&1.into(), &"stderr".into()));
        assert_eq!(value["stage"], "scale");
        assert_eq!(value["target"], "corral::worker");
        assert!(value["timestamp"].as_str().is_some_and(|t| t.len() > 10));
    }

    #[test]
    fn control_characters_in_a_text_line_are_shown_not_obeyed() {
        let line = prefixed(&worker(0), b"ok\r[worker 9] forged\x1b[2K\tend\x07", true);
        assert_eq!(line, "[worker 0] ok\n[worker 0] [worker 9] forged\\u{1b}[2K\tend\\u{7}\n");
        // A progress bar's redraws are lines of their own; colours are dropped, not escaped.
        let bar = prefixed(&worker(1), b"\r 10%|#\r 20%|##\x1b[32m ok\x1b[0m", true);
        assert_eq!(bar, "[worker 1]  10%|#\n[worker 1]  20%|## ok\n");
        assert_eq!(prefixed(&worker(0), "plain é".as_bytes(), false), "[worker 0] plain é\n");
    }

    #[test]
    fn a_worker_s_json_record_keeps_its_level_and_traceback() {
        let record = r#"{"level": "WARNING", "logger": "corral", "message": "forward failed",
            "exception": "Traceback:\n  ...\nRuntimeError: why", "worker": "not this",
            "request_id": "forged"}"#
            .replace('\n', " ");
        let value: serde_json::Value =
            serde_json::from_str(&json_line(&worker(1), &record, true)).unwrap();
        assert_eq!(value["level"], "WARN");
        assert_eq!(
            (&value["message"], &value["logger"]),
            (&"forward failed".into(), &"corral".into())
        );
        assert_eq!(value["exception"], "Traceback:\n  ...\nRuntimeError: why");
        assert_eq!(value["worker"], 1, "Corral says which worker");
        assert!(value.get("request_id").is_none(), "only a record's own fields are taken");
        for (level, as_logged) in [("CRITICAL", "ERROR"), ("ERROR", "ERROR"), ("DEBUG", "DEBUG")] {
            let line = format!(r#"{{"level": "{level}", "logger": "l", "message": "m"}}"#);
            let value: serde_json::Value =
                serde_json::from_str(&json_line(&worker(0), &line, true)).unwrap();
            assert_eq!(value["level"], as_logged);
        }
        // Not a record: without a level or a logger, a level that is not one of Python's, or
        // not text, the line is text.
        for text in [
            r#"{"message": "m", "logger": "l"}"#,
            r#"{"level": "ERROR", "message": "m"}"#,
            r#"{"level": "error", "logger": "l", "message": "m"}"#,
            r#"{"level": 40, "logger": "l", "message": "m"}"#,
            "{not json",
        ] {
            let value: serde_json::Value =
                serde_json::from_str(&json_line(&worker(0), text, false)).unwrap();
            assert_eq!((&value["level"], &value["message"]), (&"INFO".into(), &text.into()));
        }
    }

    fn split(max: usize, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut lines = Lines::new(max);
        for chunk in chunks {
            lines.push(chunk, |line| out.push(line.to_vec()));
        }
        lines.finish(|line| out.push(line.to_vec()));
        out
    }

    #[test]
    fn lines_are_split_on_newlines_across_reads() {
        let out = split(64, &[b"one\ntw", b"o\r\nthree", b"\n\nlast"]);
        assert_eq!(out, [&b"one"[..], b"two", b"three", b"", b"last"]);
    }

    #[test]
    fn a_line_longer_than_the_limit_is_cut_into_pieces() {
        let out = split(8, &[b"0123456789abcdefXYZ", b"\nnext\n"]);
        assert_eq!(out, [&b"01234567"[..], b"89abcdef", b"XYZ", b"next"]);
    }

    #[test]
    fn output_without_any_newline_is_held_at_most_one_piece_at_a_time() {
        let mut lines = Lines::new(16);
        let mut pieces = 0;
        for _ in 0..10_000 {
            lines.push(b"progress 42%\r", |line| {
                assert_eq!(line.len(), 16);
                pieces += 1;
            });
            assert!(lines.pending.len() < 16);
            assert!(lines.pending.capacity() <= 32, "the buffer grew");
        }
        assert_eq!(pieces, 10_000 * 13 / 16);
    }

    #[test]
    fn invalid_utf8_is_passed_on_as_bytes() {
        let out = split(64, &[b"ok \xff\xfe bad\n", b"after\n"]);
        assert_eq!(out, [&b"ok \xff\xfe bad"[..], b"after"]);
        assert_eq!(String::from_utf8_lossy(&out[0]), "ok \u{fffd}\u{fffd} bad");
    }

    #[test]
    fn a_character_split_by_the_limit_moves_whole_to_the_next_piece() {
        // Seven bytes of "a", then "€" (3 bytes): the limit of 8 falls inside the "€".
        let out = split(8, &["aaaaaaa€z".as_bytes()]);
        assert_eq!(out, ["aaaaaaa".as_bytes(), "€z".as_bytes()]);
        // A two-byte "é" that ends exactly at the limit stays where it is.
        let out = split(8, &["aaaaaaéz".as_bytes()]);
        assert_eq!(out, ["aaaaaaé".as_bytes(), b"z"]);
        assert!(out.iter().all(|piece| std::str::from_utf8(piece).is_ok()));
    }

    #[test]
    fn bytes_that_begin_no_character_are_cut_at_the_limit() {
        let out = split(4, &[b"\xff\xff\xff\xff\xff\n"]);
        assert_eq!(out, [&b"\xff\xff\xff\xff"[..], b"\xff"]);
    }
}
