//! Command line, environment and config file: every option is a flag and a `CORRAL_<NAME>`
//! variable; `--config FILE` adds stages, pipelines and routes ([`file`], resolved and checked
//! in [`topology`]).

pub mod file;
pub mod topology;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::stage::Policy;

/// `--max-batch-bytes`' default. A Python worker reads each batch frame into one buffer, and
/// glibc's malloc maps every block over 32 MiB afresh from the kernel, so a frame above that
/// is written into fresh pages every time (about 1 ms per MB faulted in on the machines
/// measured): 24 MiB of payloads plus the frame's own bytes stays under it (BENCHMARKS.md,
/// "Large payload targets").
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 24 * 1024 * 1024;

/// The largest `max_batch_size`, from a flag, a variable or the config file.
pub const MAX_BATCH_SIZE: u32 = 4096;
/// `--max-header-bytes`' range: below it a health probe's own head is refused; above it the
/// bound eats into what a job's frame may carry (and HTTP/2 counts it in 32 bits).
pub const HEADER_BYTES: std::ops::RangeInclusive<u64> = 256..=1_048_576;
/// `--max-headers`' range: memory for this many is set aside on each connection.
pub const HEADERS: std::ops::RangeInclusive<u64> = 8..=10_000;
/// `--stream-keepalive-ms`' largest value: a day.
pub const MAX_KEEPALIVE_MS: u64 = 86_400_000;
/// The most spawned workers of a stage (`workers`, and `workers_per_gpu`), wherever set.
pub const MAX_WORKERS: u32 = 1024;

/// Corral: a sidecar batching proxy for model serving.
///
/// Clients POST single requests to /infer; Corral queues them as jobs, gathers jobs into batches
/// and hands each batch over a Unix socket to an idle inference worker. Every option also reads
/// CORRAL_<NAME> from the environment (e.g. CORRAL_MAX_BATCH_SIZE).
#[derive(Debug, Clone, Parser)]
#[command(name = "corral", version, about, long_about = None)]
#[command(after_help = AFTER_HELP)]
pub struct Config {
    /// TOML file with stages, pipelines and routes (see below); flags and CORRAL_* variables
    /// that are set override what it says.
    #[arg(long, env = "CORRAL_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// HTTP address to serve on: HOST:PORT (an IP address, or a name such as localhost: its first
    /// IPv4 address if it has one), or :PORT for every IPv4 interface (port 0 picks a free port,
    /// logged at start).
    #[arg(long, env = "CORRAL_LISTEN", default_value = "127.0.0.1:8000", value_parser = parse_listen)]
    pub listen: SocketAddr,

    /// Unix socket that workers connect to.
    #[arg(long, env = "CORRAL_SOCKET", default_value = "corral.sock")]
    pub socket: PathBuf,

    /// Most jobs in one batch.
    #[arg(long, env = "CORRAL_MAX_BATCH_SIZE", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_SIZE)))]
    pub max_batch_size: u32,

    /// Most payload bytes in one batch (default 24 MiB; at most what a frame of --max-batch-size
    /// jobs carries): a batch ends before the job that would pass it, and a job larger than it
    /// goes alone (up to what one frame carries: 64 MiB less its framing and --max-header-bytes).
    /// It keeps frames of large jobs small enough for a worker's allocator to reuse their memory.
    #[arg(long, env = "CORRAL_MAX_BATCH_BYTES", default_value_t = DEFAULT_MAX_BATCH_BYTES,
          value_parser = at_least_one::<u64>)]
    pub max_batch_bytes: u64,

    /// Longest a job waits for batch-mates, counted from the oldest queued job's arrival (or,
    /// for jobs that queued while every worker was busy, from when a worker became free).
    #[arg(long, env = "CORRAL_MAX_WAIT_MS", default_value_t = 10)]
    pub max_wait_ms: u64,

    /// When a batch is released: `adaptive` sends as soon as waiting no longer pays (learned
    /// batch cost and arrival rate), `fixed` always waits up to max-wait for a full batch.
    #[arg(long, env = "CORRAL_BATCH_POLICY", value_enum, default_value_t = Policy::Adaptive)]
    pub batch_policy: Policy,

    /// Whether a saturated stage (every worker busy, a full batch queued) may send a busy worker
    /// its next batch ahead, hiding the round trip between two batches (`true` or `false`).
    #[arg(long, env = "CORRAL_WORKER_PREFETCH", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub worker_prefetch: bool,

    /// How many times a job is given to another worker when its worker dies, hangs or breaks
    /// the protocol while holding it; 0 for models that must not run an input twice.
    #[arg(long, env = "CORRAL_RETRIES", default_value_t = 1)]
    pub retries: u32,

    /// Default job deadline; a client's x-corral-timeout-ms may shorten it, never lengthen it.
    #[arg(long, env = "CORRAL_TIMEOUT_MS", default_value_t = 5000,
          value_parser = at_least_one::<u64>)]
    pub timeout_ms: u64,

    /// Queued jobs before new ones are shed with 503.
    #[arg(long, env = "CORRAL_QUEUE_CAPACITY", default_value_t = 1024,
          value_parser = at_least_one::<u32>)]
    pub queue_capacity: u32,

    /// Payload bytes a stage's queue holds (default 1 GiB); a request that would pass it is shed
    /// with 503 (`queue_full`). An empty queue takes any one request that passes the body limit.
    #[arg(long, env = "CORRAL_QUEUE_CAPACITY_BYTES", default_value_t = 1 << 30,
          value_parser = at_least_one::<u64>)]
    pub queue_capacity_bytes: u64,

    /// Request body limit in bytes (default 16 MiB; at least 1).
    #[arg(long, env = "CORRAL_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = at_least_one::<usize>)]
    pub max_body_bytes: usize,

    /// Shared memory for large request bodies, in bytes (default 256 MiB; 0: none). A body of
    /// 64 KiB and more is read into it (a chunked one once complete), and a worker that asks (the Python
    /// package does, on Linux) reads its payloads there instead of from its socket. Pages are taken from
    /// the system as bodies first use them, and kept; a body that finds it full (or is larger
    /// than all of it) is read as before.
    #[arg(long, env = "CORRAL_SHARED_MEMORY_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub shared_memory_bytes: usize,

    /// Streaming answers (Accept: text/event-stream or application/x-ndjson): longest a stream
    /// may last from the request's arrival; past it the stream ends with an error event
    /// (deadline_exceeded) and the job is cancelled in the worker, whatever the job's deadline.
    /// That deadline (--timeout-ms, x-corral-timeout-ms) bounds the time to the first chunk,
    /// and no later than this.
    #[arg(long, env = "CORRAL_STREAM_TIMEOUT_MS", default_value_t = 300_000,
          value_parser = at_least_one::<u64>)]
    pub stream_timeout_ms: u64,

    /// Streaming answers: most bytes of chunks a client may fall behind by; past it its job is
    /// cancelled and its stream ends with an error event (slow_client). One chunk always fits.
    #[arg(long, env = "CORRAL_STREAM_BUFFER_BYTES", default_value_t = 1024 * 1024,
          value_parser = at_least_one::<u64>)]
    pub stream_buffer_bytes: u64,

    /// Server-Sent Events: a comment line (`: keep-alive`) sent after this long without an
    /// event, so that proxies and load balancers in front (nginx, cloud balancers: 60 s idle
    /// limits) do not cut a stream whose model is thinking. 0: none.
    #[arg(long, env = "CORRAL_STREAM_KEEPALIVE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(0..=MAX_KEEPALIVE_MS))]
    pub stream_keepalive_ms: u64,

    /// Longest a worker may hold a batch before it is declared hung (its connection closed, its
    /// jobs retried or failed, a spawned worker killed and restarted). 0: the longest timeout
    /// among its jobs' routes plus one second, from when the worker got the batch (not a
    /// client's shorter deadline). A streaming worker's clock counts its silence since its last
    /// frame instead.
    #[arg(long, env = "CORRAL_BATCH_TIMEOUT_MS", default_value_t = 0)]
    pub batch_timeout_ms: u64,

    /// Most open HTTP connections. Past it, 16 more are let in for probes and Corral's own pages,
    /// one request each (any other is answered 503 `too_many_connections`); one more past those
    /// is answered 503 (`too_many_connections`) and closed.
    #[arg(long, env = "CORRAL_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = at_least_one::<u32>)]
    pub max_connections: u32,

    /// Most requests one HTTP/2 connection may have in progress at once (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS; default 100, RFC 9113's recommended minimum). Each may
    /// hold a body arriving and an answer going out, so the memory one connection holds over
    /// HTTP/2 is this many times what it holds over HTTP/1.1.
    #[arg(long, env = "CORRAL_HTTP2_MAX_STREAMS", default_value_t = 100,
          value_parser = at_least_one::<u32>, value_name = "N")]
    pub http2_max_streams: u32,

    /// Time a client has to send an HTTP/1.1 request's headers, counted from the request's first
    /// byte (behind an answer still being written, from that answer's end). HTTP/2 heads, and a
    /// head that starts while the previous request's handler runs, have --idle-timeout-ms.
    #[arg(long, env = "CORRAL_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = at_least_one::<u64>)]
    pub header_read_timeout_ms: u64,

    /// Time a client has to send a request's body, counted from the end of its headers; the
    /// job's deadline ends it sooner. Past it: 408 (`body_timeout`) and the connection closed.
    #[arg(long, env = "CORRAL_BODY_READ_TIMEOUT_MS", default_value_t = 30_000,
          value_parser = at_least_one::<u64>)]
    pub body_read_timeout_ms: u64,

    /// How long a keep-alive connection may sit idle (no request in progress) before it is
    /// closed; an answer being written, a stream too, is a request in progress. It also bounds
    /// an answer its client does not read: no progress for this long (HTTP/1.1: nothing
    /// written; HTTP/2: no 16 KiB piece taken; a client's PINGs count for nothing).
    #[arg(long, env = "CORRAL_IDLE_TIMEOUT_MS", default_value_t = 60_000,
          value_parser = at_least_one::<u64>)]
    pub idle_timeout_ms: u64,

    /// Largest request head (request line and headers) in bytes, 256 B to 1 MiB; larger is
    /// answered 431.
    #[arg(long, env = "CORRAL_MAX_HEADER_BYTES", default_value_t = 65_536,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(HEADER_BYTES))]
    pub max_header_bytes: usize,

    /// Most headers in a request, 8 to 10,000; more is answered 431.
    #[arg(long, env = "CORRAL_MAX_HEADERS", default_value_t = 100,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(HEADERS))]
    pub max_headers: usize,

    /// At SIGTERM/SIGINT/SIGQUIT/SIGHUP: how long queued and in-flight jobs get to finish before what is left
    /// is answered 503.
    #[arg(long, env = "CORRAL_GRACE_PERIOD_MS", default_value_t = 10_000)]
    pub grace_period_ms: u64,

    /// Permissions of the worker socket, in octal: owner-only by default; 660 lets the socket's
    /// group in (workers running as another user of that group).
    #[arg(long, env = "CORRAL_SOCKET_MODE", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,

    /// Log lines as human-readable text or as one JSON object per line (for log pipelines).
    /// The level comes from RUST_LOG (default: info; per-request lines appear at debug).
    #[arg(long, env = "CORRAL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Export spans over OTLP/HTTP (protobuf) to this collector, e.g. http://localhost:4318
    /// (spans go to its /v1/traces). Unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as is), then
    /// OTEL_EXPORTER_OTLP_ENDPOINT; none of them: no tracing at all. The service name is
    /// OTEL_SERVICE_NAME (default: corral).
    #[arg(long, env = "CORRAL_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// Share of new traces sampled, 0 to 1; a request's `traceparent` decides for its own trace.
    #[arg(long, env = "CORRAL_TRACE_SAMPLE_RATIO", default_value_t = 1.0,
          value_parser = parse_ratio)]
    pub trace_sample_ratio: f64,

    /// Most total weight in one batch (an item's weight: its x-corral-weight header, else the
    /// workers' declared weight rule, else 1); a batch ends when the next item would pass it, and
    /// an item heavier than it goes alone. Unset: batches are bounded by count and bytes only.
    #[arg(long, env = "CORRAL_MAX_BATCH_WEIGHT", value_name = "N",
          value_parser = at_least_one::<u64>)]
    pub max_batch_weight: Option<u64>,

    /// How long a queued job waits in its priority class (x-corral-priority), held back by the
    /// higher classes, before it is promoted to the next: a low job competes as high after
    /// twice this (in a pipeline, each stage takes it in at the class it reached on the stage
    /// before, and ages it from its entry there). Time its class was being served does not
    /// count.
    #[arg(long, env = "CORRAL_PRIORITY_AGING_MS", default_value_t = 5000,
          value_parser = at_least_one::<u64>)]
    pub priority_aging_ms: u64,

    /// The request header that names a request's tenant, for fair shares of batches and of the
    /// queue (e.g. x-api-key); not one Corral reads for something else (x-corral-priority, …).
    /// Its values are never logged nor made metric labels.
    #[arg(long, env = "CORRAL_TENANT_HEADER", default_value = "x-corral-tenant",
          value_parser = parse_header_name, value_name = "NAME")]
    pub tenant_header: http::HeaderName,

    /// Largest share of a stage's queue (--queue-capacity) one tenant may hold, above 0 and at
    /// most 1; its excess is shed with 503 (tenant_quota). 1: no bound.
    #[arg(long, env = "CORRAL_TENANT_QUEUE_SHARE", default_value_t = 1.0,
          value_parser = parse_share, value_name = "SHARE")]
    pub tenant_queue_share: f64,

    /// With WORKER_CMD: the GPUs to spread the workers over, e.g. 0,1 (or `all`: the machine's,
    /// from nvidia-smi -L). Each worker sees exactly its device (CUDA_VISIBLE_DEVICES, and
    /// CORRAL_GPU names it); a restarted worker gets the same device back.
    #[arg(long, env = "CORRAL_GPUS", value_name = "LIST")]
    pub gpus: Option<String>,

    /// With WORKER_CMD: pin worker i to core LIST[i] (Linux), one core per worker, e.g. 14,15;
    /// --workers then defaults to the cores listed. For a GPU worker whose model is bound by
    /// the CPU launching its kernels, a core of its own keeps its one thread from being moved
    /// about (see docs/DEPLOY.md); the proxy's own threads, and unpinned workers, keep off the
    /// pinned cores. With --config, for a file of one stage, whose `cpus` it replaces.
    #[arg(long, env = "CORRAL_CPUS", value_name = "LIST", value_delimiter = ',',
          value_parser = parse_core)]
    pub cpus: Vec<usize>,

    /// With --gpus: workers per device; --workers then defaults to the devices times this.
    #[arg(long, env = "CORRAL_WORKERS_PER_GPU", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_WORKERS)))]
    pub workers_per_gpu: u32,

    /// With WORKER_CMD: an environment variable for every spawned worker (repeatable; in
    /// CORRAL_WORKER_ENV separated by `;`). Values may use {index} and {gpu}.
    // Split at `;` only when read from the variable ([`Config::split_worker_env`]): a flag's
    // value is taken whole (clap's delimiter split both, and a connection string such as
    // `A=Protocol=https;AccountName=x` became four variables, silently). Each pair is checked
    // where the stages are resolved (`topology::workers`), after the split.
    #[arg(long = "worker-env", env = "CORRAL_WORKER_ENV", value_name = "NAME=VALUE")]
    pub worker_env: Vec<String>,

    /// The config file's top-level `worker_env` (`NAME=VALUE` entries): defaults for every
    /// stage's spawned workers, under the stage's own `env` and `--worker-env`.
    #[arg(skip)]
    pub file_worker_env: Vec<String>,

    /// With WORKER_CMD: how many copies to spawn, each with CORRAL_SOCKET set (with --gpus the
    /// default is the devices times --workers-per-gpu, with --cpus the cores listed).
    #[arg(long, env = "CORRAL_WORKERS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_WORKERS)))]
    pub workers: u32,

    /// Worker command to spawn (after `--`). Without it, workers are started elsewhere and
    /// connect to --socket on their own.
    #[arg(last = true, value_name = "WORKER_CMD")]
    pub worker_cmd: Vec<String>,
}

/// `corral --help`'s closing part: examples and the config file, in full.
const AFTER_HELP: &str = include_str!("config/after_help.txt");

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A count or length that must be at least 1, read as clap's own integer parser reads it
/// (`invalid digit found in string`, `number too large to fit in target type`). clap's range
/// check said `0 is not in 1..18446744073709551615`, a half-open range that leaves out the
/// largest value it takes; the config file says it as this does.
fn at_least_one<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr + From<u8> + PartialOrd,
    T::Err: std::fmt::Display,
{
    let value = text.parse::<T>().map_err(|e| e.to_string())?;
    if value < T::from(1) {
        return Err("must be at least 1".to_string());
    }
    Ok(value)
}

fn parse_ratio(text: &str) -> Result<f64, String> {
    let ratio = text.parse::<f64>().map_err(|_| format!("{text:?} is not a number from 0 to 1"))?;
    check_ratio(ratio).map_err(|_| format!("{text:?} is not a number from 0 to 1"))
}

/// A trace sample ratio, as a flag or the config file gives it.
pub(crate) fn check_ratio(ratio: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&ratio) {
        Ok(ratio)
    } else {
        Err(format!("{ratio} is not a number from 0 to 1"))
    }
}

impl Config {
    /// `CORRAL_WORKER_ENV`'s pairs, separated by `;` in the one variable: called where the
    /// value came from the environment (empty pieces, a trailing `;`, are skipped). Each pair is
    /// checked where the stages are resolved.
    pub fn split_worker_env(&mut self) {
        self.worker_env = self
            .worker_env
            .iter()
            .flat_map(|value| value.split(';'))
            .filter(|pair| !pair.is_empty())
            .map(String::from)
            .collect();
    }
}

/// An address to listen on as people write one: `127.0.0.1:8000`, `[::1]:8000`,
/// `localhost:8000` (the name's first IPv4 address, else its first: clients and probes that
/// name the host mostly reach it over IPv4, and `localhost` often resolves to `::1` first), or
/// `:8000` (every IPv4 interface, as Go's and many servers' `:PORT` means).
pub(crate) fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    if let Some(port) = text.strip_prefix(':') {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
        }
    }
    let refused = |why: String| {
        format!(
            "{text:?} is not an address to listen on (HOST:PORT, or :PORT for every IPv4 \
             interface): {why}"
        )
    };
    use std::net::ToSocketAddrs;
    let found: Vec<SocketAddr> =
        text.to_socket_addrs().map_err(|e| refused(e.to_string()))?.collect();
    let first = found.iter().find(|address| address.is_ipv4()).or(found.first());
    first.copied().ok_or_else(|| refused("the name has no address".into()))
}

pub(crate) fn parse_share(text: &str) -> Result<f64, String> {
    let refused = || format!("{text:?} is not a share above 0 and at most 1 (e.g. 0.25)");
    let share = text.parse::<f64>().map_err(|_| refused())?;
    check_share(share).map_err(|_| refused())
}

/// A tenant's queue share, as a flag or the config file gives it.
pub(crate) fn check_share(share: f64) -> Result<f64, String> {
    if share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(format!("\"{share}\" is not a share above 0 and at most 1 (e.g. 0.25)"))
    }
}

pub(crate) fn parse_header_name(text: &str) -> Result<http::HeaderName, String> {
    let name = http::HeaderName::from_bytes(text.trim().as_bytes())
        .map_err(|_| format!("{text:?} is not a valid HTTP header name"))?;
    // A header Corral reads for something else would be read as both (and listed twice in
    // /openapi.json, which is then invalid). The client's x-request-id is logged with its
    // request (a tenant's value never is), and names one request, not a tenant.
    use crate::http::{deadline, protocols::native, protocols::v2, routes, traffic};
    use http::header::{
        ACCEPT, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, EXPECT, HOST,
        TRANSFER_ENCODING,
    };
    let own = [
        traffic::PRIORITY_HEADER,
        traffic::WEIGHT_HEADER,
        native::ITEMS_HEADER,
        deadline::TIMEOUT_HEADER,
        deadline::ENVOY_HEADER,
        deadline::GRPC_HEADER,
        deadline::REQUEST_TIMEOUT_HEADER,
        routes::REQUEST_ID_HEADER,
        v2::HEADER_LENGTH,
        // W3C trace context, read by OpenTelemetry's propagator (no constant names them).
        "traceparent",
        "tracestate",
        CONTENT_TYPE.as_str(),
        CONTENT_LENGTH.as_str(),
        ACCEPT.as_str(),
        // The body's framing and coding (a coded body is refused 415), read by hyper or here.
        CONTENT_ENCODING.as_str(),
        TRANSFER_ENCODING.as_str(),
        EXPECT.as_str(),
        CONNECTION.as_str(),
        // HTTP/1.1 must carry one (checked here); HTTP/2 carries it as `:authority`, and as a
        // tenant its clients had none: they escaped every tenant's quota and turns.
        HOST.as_str(),
    ];
    if own.contains(&name.as_str()) {
        return Err(format!("{name} is a header Corral reads for something else"));
    }
    // A connection's own headers (hop-by-hop): a proxy in front drops them, HTTP/2 forbids them
    // (`te` but for `trailers`), so a tenant named by one would reach Corral from some clients
    // and not from others.
    if ["te", "upgrade", "keep-alive", "proxy-connection"].contains(&name.as_str()) {
        return Err(format!(
            "{name} cannot name a tenant: it is a connection's own header, which proxies drop \
             and HTTP/2 forbids"
        ));
    }
    if name == COOKIE {
        // Several cookies in one field, and over HTTP/2 one field per cookie (fields that
        // differ: every such request a 400).
        return Err("cookie cannot name a tenant: it holds every cookie of the client, one \
                    field per cookie over HTTP/2; have the gateway copy the tenant into a \
                    header of its own"
            .to_string());
    }
    Ok(name)
}

pub(crate) fn parse_mode(text: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| format!("{text:?} is not an octal file mode such as 600 or 660"))?;
    if mode & 0o222 == 0 {
        // Connecting to a Unix socket takes write permission: only root would get in.
        return Err(format!(
            "{text:?} lets no one write the socket, and a worker needs that to connect (only one \
             running as root would get in): use 600 or 660"
        ));
    }
    Ok(mode)
}

/// One core of `--cpus`, spaces around it allowed (`0, 1`, as the config file's list may be
/// written): clap had said "invalid digit found in string" of ` 1`.
fn parse_core(text: &str) -> Result<usize, String> {
    text.trim().parse().map_err(|_| format!("{text:?} is not a core number (0, 1, 2, …)"))
}

impl Config {
    /// Where spans go (the full URL of the traces endpoint), if anywhere.
    pub fn traces_endpoint(&self) -> Option<String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let base = |url: String| {
            if !url.parse::<http::Uri>().is_ok_and(|uri| crate::trace::is_collector_url(&uri)) {
                // Left as written, for the check to name it: the path added to `http://` had
                // been refused as "http:/v1/traces", and `https://collector:4318` as
                // "https://collector:4318/v1/traces", which the operator never wrote.
                return url;
            }
            // The path goes before a query (it had been added after one: `/?a=1/v1/traces`).
            let (path, query) = url.split_once('?').map_or((&url[..], None), |(p, q)| (p, Some(q)));
            let path = path.trim_end_matches('/');
            let path = match path.ends_with("/v1/traces") {
                true => path.to_string(),
                false => format!("{path}/v1/traces"),
            };
            query.map_or(path.clone(), |query| format!("{path}?{query}"))
        };
        self.otlp_endpoint
            .clone()
            .filter(|v| !v.trim().is_empty())
            .map(base)
            .or_else(|| var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT").map(base))
    }

    pub fn batch_timeout(&self) -> Option<Duration> {
        (self.batch_timeout_ms > 0).then(|| Duration::from_millis(self.batch_timeout_ms))
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_millis(self.grace_period_ms)
    }

    pub fn max_wait(&self) -> Duration {
        Duration::from_millis(self.max_wait_ms)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn priority_aging(&self) -> Duration {
        Duration::from_millis(self.priority_aging_ms)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{parse_core, parse_header_name, Config};

    #[test]
    fn the_traces_path_joins_the_endpoint_s_path_before_its_query() {
        let traces = |endpoint: &str| {
            Config::parse_from(["corral", "--otlp-endpoint", endpoint]).traces_endpoint().unwrap()
        };
        assert_eq!(traces("http://h:4318"), "http://h:4318/v1/traces");
        assert_eq!(traces("http://h:4318/base/"), "http://h:4318/base/v1/traces");
        assert_eq!(traces("http://h:4318/v1/traces/"), "http://h:4318/v1/traces");
        assert_eq!(traces("http://h:4318/?a=1"), "http://h:4318/v1/traces?a=1");
        assert_eq!(traces("http://h:4318/v1/traces?a=1"), "http://h:4318/v1/traces?a=1");
        // No URL with a host: as written, for the check to name it.
        assert_eq!(traces("http://"), "http://");
        assert_eq!(traces("bad"), "bad");
        // Nor one of another scheme, which the check refuses.
        assert_eq!(traces("https://h:4318"), "https://h:4318");
    }

    #[test]
    fn a_core_may_be_written_with_spaces_around_it() {
        assert_eq!(parse_core(" 1"), Ok(1));
        assert_eq!(parse_core("14 "), Ok(14));
        assert!(parse_core("x").unwrap_err().contains("\"x\" is not a core number"));
        assert!(parse_core("").is_err());
    }

    #[test]
    fn every_header_corral_reads_is_refused_as_the_tenant_header_in_any_case() {
        // As a user would write them: a tenant header that is also one of these would be read
        // as both (and a request id would be logged, which a tenant's value never is).
        let read = [
            "x-corral-priority",
            "x-corral-weight",
            "x-corral-items",
            "x-corral-timeout-ms",
            "x-envoy-expected-rq-timeout-ms",
            "grpc-timeout",
            "request-timeout",
            "x-request-id",
            "inference-header-content-length",
            "traceparent",
            "tracestate",
            "content-type",
            "content-length",
            "accept",
            "content-encoding",
            "transfer-encoding",
            "expect",
            "connection",
            "host",
        ];
        for name in read {
            for spelled in [name.to_string(), name.to_uppercase(), format!(" {name} ")] {
                let refused = parse_header_name(&spelled).expect_err(&spelled);
                assert_eq!(refused, format!("{name} is a header Corral reads for something else"));
            }
        }
        assert!(parse_header_name("Cookie")
            .unwrap_err()
            .starts_with("cookie cannot name a tenant"));
        for name in ["x-corral-tenant", "x-api-key", "authorization-tenant"] {
            assert_eq!(parse_header_name(name).unwrap().as_str(), name);
        }
    }
}
