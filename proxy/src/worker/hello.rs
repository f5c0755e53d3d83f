//! A worker's hello: read within [`HELLO_TIMEOUT`], checked ([`handshake`]: the protocol
//! version, the stage, its tensors, its weight rule, `max_batch`), and refused with a `reject`
//! frame saying why ([`refuse`]) where this proxy cannot serve it; what it declares (schemas,
//! tensors, a weight rule) read for the stage to keep ([`declarations`]). The joining itself, with
//! the checks against the stage's other workers, is the connection's ([`super::connection`]).

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use corral_protocol::{
    DecodeError, Hello, ProxyMessage, Reject, WorkerMessage, FEATURE_STREAM, PROTOCOL_VERSION,
};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::outbox::Outbox;
use super::words::{clipped, logged, logged_within};
use super::Inbox;
use crate::http::protocols::v2::tensor::DataType;
use crate::metrics::{metrics, WorkerFailure, UNKNOWN_STAGE};
use crate::stage::{Declared, Stage, WeightRule};
use crate::supervisor::SpawnedWorker;

/// How long a new connection has to say hello before it is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest schema (or set of schema components) a hello may declare. Schemas are documentation,
/// each copied into `/openapi.json` where its routes use it: one of 50 MB made that document 209
/// MB and the proxy's memory 1.2 GB. Real ones are kilobytes; one of 4 MiB (10,000 described
/// fields) is served, and tested.
const MAX_SCHEMA_BYTES: usize = 8 * 1024 * 1024;

/// The stage a spawned worker was spawned for, where it said hello for another that Corral
/// spawns workers for too: its `--stage`, `run(stage=...)` or a CORRAL_STAGE of its own. Taken,
/// the stage it was spawned for never got a worker, and every request there waited for its
/// 408. A process a spawned launcher starts for a stage with no `command` is let in, as before.
pub(super) fn misplaced<'a>(
    child: Option<&'a SpawnedWorker>,
    stage: &Stage,
    spawning: &HashSet<String>,
) -> Option<&'a str> {
    let own = child?.stage();
    (own != stage.name() && spawning.contains(stage.name())).then_some(own)
}

/// Reads the JSON Schemas a worker declared, for `/openapi.json`, its tensors, for v2 clients, and
/// its weight rule, for the stage's batches. Schemas that do not parse (or pass
/// [`MAX_SCHEMA_BYTES`]) are logged and ignored: they are documentation, and must not cost the
/// worker its connection.
pub(super) fn declarations(hello: &Hello) -> Option<Declared> {
    let parse = |text: &Option<String>| -> Option<serde_json::Value> {
        let text = text.as_deref()?;
        if text.len() > MAX_SCHEMA_BYTES {
            let bytes = text.len();
            warn!(pid = hello.pid, bytes, "ignoring a worker's schema larger than 8 MiB");
            return None;
        }
        let schema: serde_json::Value = serde_json::from_str(text)
            .inspect_err(
                |e| warn!(pid = hello.pid, error = %logged(e), "ignoring a worker's schema"),
            )
            .ok()?;
        // A JSON Schema is an object (or `true`/`false`): another value (`5`) copied into the
        // document made all of `/openapi.json` invalid, every route's operations with it.
        if !(schema.is_object() || schema.is_boolean()) {
            warn!(pid = hello.pid, "ignoring a worker's schema that is no JSON object");
            return None;
        }
        Some(schema)
    };
    let (input, output) = (parse(&hello.input_schema), parse(&hello.output_schema));
    let weight = hello.weight.as_deref().and_then(|pointer| WeightRule::parse(pointer).ok());
    let tensors = hello.declares_tensors();
    if input.is_none() && output.is_none() && !tensors && weight.is_none() {
        return None;
    }
    let mut components = match parse(&hello.schema_components) {
        Some(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let before = components.len();
    components.retain(|_, schema| schema.is_object() || schema.is_boolean());
    if components.len() < before {
        warn!(pid = hello.pid, "ignoring a worker's schema components that are no JSON objects");
    }
    let (inputs, outputs) = (hello.inputs.clone(), hello.outputs.clone());
    // Its output schema is a chunk's: only where it declared one.
    let chunks = hello.declares(FEATURE_STREAM) && output.is_some();
    Some(Declared { input, output, components, chunks, inputs, outputs, weight })
}

/// Why a hello's tensor declarations cannot be served, if they cannot: a datatype v2 does not
/// have would turn every v2 request into a 400 naming it; a name declared twice among the
/// inputs (or the outputs) would be listed twice in every answer and in the metadata; a
/// dimension below −1 (−1 is "any length") is no shape; an empty name no v2 client can name
/// (it had been served, as `""`).
fn undeclarable(hello: &Hello) -> Option<String> {
    if hello.inputs.iter().chain(&hello.outputs).any(|spec| spec.name.is_empty()) {
        return Some("a tensor's name is empty".to_string());
    }
    for side in [&hello.inputs, &hello.outputs] {
        let mut names = std::collections::HashSet::new();
        if let Some(twice) = side.iter().find(|spec| !names.insert(spec.name.as_str())) {
            return Some(format!("tensor {:?} is declared twice", clipped(&twice.name)));
        }
    }
    let tensors = hello.inputs.iter().chain(&hello.outputs);
    tensors.into_iter().find_map(|spec| {
        if let Some(dimension) = spec.shape.iter().find(|&&d| d < -1) {
            return Some(format!(
                "tensor {:?}: a dimension is a length or -1 (any), not {dimension}",
                clipped(&spec.name)
            ));
        }
        DataType::parse(&spec.datatype)
            .err()
            .map(|problem| format!("tensor {:?}: {problem}", clipped(&spec.name)))
    })
}

/// Reads the hello and checks it; refuses (with a `reject` frame) what this proxy cannot serve.
/// A connection that has not said hello when the proxy stops is dropped at once. A refused
/// spawned worker (`child`) is refused again at every restart: its stage's `/readyz` says why.
pub(super) async fn handshake(
    inbox: &mut Inbox,
    outbox: &mut Outbox,
    stages: &HashMap<String, Arc<Stage>>,
    shutdown: &CancellationToken,
    child: Option<&SpawnedWorker>,
) -> Option<(Hello, Arc<Stage>)> {
    let first = tokio::select! {
        first = tokio::time::timeout(HELLO_TIMEOUT, inbox.next()) => first,
        _ = shutdown.cancelled() => return None,
    };
    // A connection that said nothing is no worker refused: a probe of the socket, or a
    // half-open connection, would have counted as one in the failures alerts read.
    let silent = first.is_err();
    let first = match first {
        // Refused, saying why: a worker that said nothing yet may still be reading.
        Err(_) => {
            Err(format!("no hello within {HELLO_TIMEOUT:?}: a worker's first frame is its hello"))
        }
        Ok(None) => return None,
        // A frame that arrived whole but is not a valid message (a hello without `pid`, a
        // version that is not an integer, a frame over the limit): refused, saying why.
        Ok(Some(Err(e)))
            if matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput) =>
        {
            // A msgpack map that is no valid hello (a `version` as a string, no `pid`) comes
            // from a worker: its supervisor may kill it if it lives on. Not bytes that are no
            // map, or no frame at all (a wrapper's `echo ping` read as a length of 1.9 GB).
            let decoded = e.get_ref().and_then(|inner| inner.downcast_ref::<DecodeError>());
            if decoded.is_some_and(|d| !matches!(d, DecodeError::NotAMap(_) | DecodeError::Empty)) {
                child.inspect(|child| child.spoke());
            }
            Err(format!(
                "malformed hello: {e}; a hello needs `type` \"hello\", `version` (an integer), \
                 `stage` (a string) and `pid` (an integer)"
            ))
        }
        // The connection broke inside the first frame: nobody is there to tell.
        Ok(Some(Err(e))) => {
            warn!(error = %logged(&e), "worker connection closed before its hello");
            return None;
        }
        Ok(Some(Ok(message))) => {
            // A worker, refused or not: its supervisor may kill it if it then lives on without
            // a connection. Not for a frame that is no message (a wrapper's probe writing a
            // line to the socket, `echo ok | nc -U`, would have its loading worker killed).
            child.inspect(|child| child.spoke());
            Ok(message)
        }
    };
    // The parser's own reason: "must start with /" had been said of "/a~2".
    let bad_weight = match &first {
        Ok(WorkerMessage::Hello(hello)) => {
            hello.weight.as_deref().and_then(|w| WeightRule::parse(w).err())
        }
        _ => None,
    };
    let refusal = match first {
        Err(malformed) => malformed,
        Ok(WorkerMessage::Hello(hello)) if hello.version != PROTOCOL_VERSION => format!(
            "protocol version {} is not supported; this proxy speaks version {PROTOCOL_VERSION}",
            hello.version
        ),
        Ok(WorkerMessage::Hello(_)) if bad_weight.is_some() => bad_weight.unwrap_or_default(),
        Ok(WorkerMessage::Hello(hello)) if hello.max_batch == Some(0) => {
            "max_batch 0 would take no job: it is at least 1 (leave it out for no bound)".into()
        }
        Ok(WorkerMessage::Hello(hello)) => match (undeclarable(&hello), stages.get(&hello.stage)) {
            (Some(why), _) => why,
            (None, Some(stage)) => return Some((hello, stage.clone())),
            (None, None) => {
                let mut names: Vec<&str> = stages.keys().map(String::as_str).collect();
                names.sort_unstable();
                let names = names.join(", ");
                format!("unknown stage {:?}; this proxy serves: {names}", clipped(&hello.stage))
            }
        },
        Ok(_) => "the first message must be a hello".to_string(),
    };
    // Not labelled with the stage the worker claimed, which must not grow the label set: a
    // spawned worker's under the stage it was spawned for (the one left without it), as a
    // refusal after the hello counts it.
    let own = child.map(SpawnedWorker::stage).filter(|stage| stages.contains_key(*stage));
    let counted = (!silent).then(|| own.unwrap_or(UNKNOWN_STAGE));
    refuse(outbox, child, stages, counted, &refusal);
    None
}

/// A worker refused at its hello, for `why`: logged, counted under `counted` (None: not
/// counted), and told (it may already be gone; the log has it either way). A spawned worker is
/// refused again at every restart, so its stage's `/readyz` says why as well (an external
/// worker's refusal is the log's alone: its stage is whatever it claimed). `why` is escaped and
/// cut first, shorter in the log: it may carry the worker's own words (its stage's or its
/// tensors' names), and a name with a line break had forged a log line, one of megabytes
/// written a line as long.
pub(super) fn refuse(
    outbox: &mut Outbox,
    child: Option<&SpawnedWorker>,
    stages: &HashMap<String, Arc<Stage>>,
    counted: Option<&str>,
    why: &str,
) {
    let message = logged_within(&why, 2_000);
    if let Some(own) = child.and_then(|child| stages.get(child.stage())) {
        own.worker_refused(&message);
    }
    if let Some(counted) = counted {
        metrics()
            .worker_failures
            .with_label_values(&[counted, WorkerFailure::Refused.label()])
            .inc();
    }
    // Logged once `/readyz` and the metric say so: a reader of the line (a test, an operator)
    // had found `/readyz` not knowing it yet.
    let kind = alike(why);
    if let Some(alike_not_logged) = REFUSALS.lock().unwrap_or_else(|p| p.into_inner()).log(&kind) {
        warn!(reason = %logged(&why), alike_not_logged, "worker refused");
    }
    outbox.send(ProxyMessage::Reject(Reject { message }));
}

/// How often one reason for refusing a worker is written to the log, at most: a worker that
/// connects again as soon as it is refused (a wrapper's loop) is refused for the same reason
/// again and again, and logged each time had written 11,000 lines (1.5 MB) in 3 s. The
/// metric counts every refusal.
const REFUSAL_LOGGED_EVERY: Duration = Duration::from_secs(60);

/// Reasons remembered, at most: past it they are forgotten all at once (a worker's own words
/// are in them, so they are not kept without bound).
const REFUSALS_KEPT: usize = 64;

static REFUSALS: std::sync::Mutex<Refusals> = std::sync::Mutex::new(Refusals::new());

/// A refusal's reason without the worker's own words (quoted, as `{:?}` writes them): the
/// key under which refusals are logged once a minute. Keyed by the whole text, a worker that
/// named another stage at each try was logged every time.
fn alike(why: &str) -> String {
    let mut kind = String::with_capacity(why.len());
    let mut chars = why.chars();
    while let Some(c) = chars.next() {
        kind.push(c);
        if c != '"' {
            continue;
        }
        // Inside quotes until the unescaped closing one.
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    kind.push('"');
                    break;
                }
                _ => {}
            }
        }
    }
    kind
}

/// When each reason was last logged, and how many refusals for it were not logged since.
struct Refusals {
    reasons: Option<HashMap<String, (std::time::Instant, u64)>>,
}

impl Refusals {
    const fn new() -> Self {
        Self { reasons: None }
    }

    /// Whether to log a refusal for `why` now: Some(how many alike were not logged since the
    /// last line), or None within a minute of that line.
    fn log(&mut self, why: &str) -> Option<u64> {
        let now = std::time::Instant::now();
        let reasons = self.reasons.get_or_insert_with(HashMap::new);
        if let Some((at, unlogged)) = reasons.get_mut(why) {
            if now.duration_since(*at) < REFUSAL_LOGGED_EVERY {
                *unlogged += 1;
                return None;
            }
            let alike = std::mem::take(unlogged);
            *at = now;
            return Some(alike);
        }
        if reasons.len() >= REFUSALS_KEPT {
            reasons.clear();
        }
        reasons.insert(why.to_owned(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use corral_protocol::ProxyCodec;
    use tokio::net::UnixStream;
    use tokio_util::codec::FramedRead;

    use super::*;

    #[test]
    fn refusals_alike_but_for_the_worker_s_words_are_one_reason() {
        let one = alike(r#"unknown stage "evil-1"; this proxy serves: default"#);
        assert_eq!(one, r#"unknown stage ""; this proxy serves: default"#);
        assert_eq!(alike(r#"unknown stage "a\"b"; x"#), r#"unknown stage ""; x"#);
        assert_eq!(alike("version 2"), "version 2");
    }

    #[test]
    fn a_refusal_for_the_same_reason_is_logged_once_a_minute_others_at_once() {
        let mut refusals = Refusals::new();
        assert_eq!(refusals.log("version 2"), Some(0));
        for _ in 0..1000 {
            assert_eq!(refusals.log("version 2"), None);
        }
        assert_eq!(refusals.log("unknown stage"), Some(0), "another reason waits for nothing");
        // Past what is kept, every reason is forgotten, and logged again.
        for i in 0..REFUSALS_KEPT {
            refusals.log(&format!("reason {i}"));
        }
        assert_eq!(refusals.log("version 2"), Some(0));
    }

    /// As long as the connection gives its closing frame.
    const CLOSE_WRITE_LIMIT: Duration = Duration::from_secs(1);

    /// Held by the tests here that refuse a worker under `stage="unknown"`, and by the one
    /// that reads that count: the metric is the process's, and a refusal counted in between
    /// had failed the reader, now and then.
    static UNKNOWN_REFUSALS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test(start_paused = true)]
    async fn a_connection_silent_past_the_hello_timeout_is_told_why() {
        // It was closed without a word: the worker saw a bare end of file.
        let (proxy_end, worker_end) = UnixStream::pair().unwrap();
        let (read, write) = proxy_end.into_split();
        let mut inbox = FramedRead::new(read, ProxyCodec::default());
        let mut outbox = Outbox::new(write);
        let (stages, shutdown) = (HashMap::new(), CancellationToken::new());
        let refused =
            || metrics().worker_failures.with_label_values(&[UNKNOWN_STAGE, "refused"]).get();
        let _counting = UNKNOWN_REFUSALS.lock().await;
        let before = refused();
        assert!(handshake(&mut inbox, &mut outbox, &stages, &shutdown, None).await.is_none());
        // Nor is it counted as a worker refused (OBSERVABILITY.md): a probe of the socket is
        // no worker, and the failures' alerts read that count.
        assert_eq!(refused(), before);
        outbox.close(CLOSE_WRITE_LIMIT).await;
        let mut heard = FramedRead::new(worker_end, corral_protocol::WorkerCodec::default());
        match heard.next().await {
            Some(Ok(ProxyMessage::Reject(reject))) => {
                assert!(reject.message.starts_with("no hello within 10s"), "{}", reject.message)
            }
            other => panic!("expected a reject, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_malformed_hello_is_a_worker_speaking_and_junk_is_not() {
        // A spawned worker refused for a `version` that is a string lives on: its supervisor
        // must count it as one that spoke (and kill it); a wrapper's `ping` must not be.
        let _counting = UNKNOWN_REFUSALS.lock().await;
        for (frame, spoke) in [
            (
                rmp_serde::to_vec_named(&serde_json::json!({
                    "type": "hello", "version": "1", "stage": "default", "pid": 7,
                }))
                .unwrap(),
                true,
            ),
            (b"ping".to_vec(), false),
        ] {
            let (proxy_end, worker_end) = UnixStream::pair().unwrap();
            let (read, write) = proxy_end.into_split();
            let mut inbox = FramedRead::new(read, ProxyCodec::untrusted());
            let mut outbox = Outbox::new(write);
            let (stages, shutdown) = (HashMap::new(), CancellationToken::new());
            let child = SpawnedWorker::default();
            let mut sent = worker_end;
            let framed = if spoke {
                [&(frame.len() as u32).to_be_bytes()[..], &frame].concat()
            } else {
                frame // read as the length of a frame of 1.9 GB
            };
            tokio::io::AsyncWriteExt::write_all(&mut sent, &framed).await.unwrap();
            let heard = handshake(&mut inbox, &mut outbox, &stages, &shutdown, Some(&child)).await;
            assert!(heard.is_none(), "refused");
            assert_eq!(child.has_spoken(), spoke, "{framed:?}");
        }
    }
}
