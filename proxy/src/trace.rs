//! OpenTelemetry spans, exported over OTLP/HTTP (protobuf) when an endpoint is configured
//! (`--otlp-endpoint`); see docs/TRACING.md for what each span means.
//!
//! Tracing is a layer: the edge ([`crate::http::routes`]) opens the request's server span (the
//! child of the client's `traceparent`, if it sent one) and keeps its context in the request's
//! task-local ([`crate::timing`]); the pipeline adds the admission and queue-wait spans at the
//! two points where they happen, and the worker connection the batch span, with links both ways
//! between a batch and its members. Every one of those points starts with [`tracer`], one atomic
//! load: without an endpoint no span, context or link is ever made, and nothing is allocated.
//!
//! Export never slows a request: ended spans go into a bounded queue ([`QUEUE_SPANS`]) that one
//! thread of its own drains in batches; a span that finds the queue full is dropped, and so are
//! the spans of an export that failed, both counted in `corral_spans_dropped_total`.

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SamplingDecision, SamplingResult, SdkTracer, SdkTracerProvider, ShouldSample, Span,
};
use opentelemetry_sdk::Resource;
use tokio::time::Instant;

use crate::job::{Job, Sent, SentSlot};
use crate::metrics::WorkerFailure;
use crate::stage::Shed;

mod export;
mod otlp;

pub use export::{is_collector_url, QUEUE_SPANS};

struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    /// A wall-clock time and the monotonic instant it was read at, to place spans measured with
    /// `Instant`s (queue waits) on the wall clock.
    base: (SystemTime, std::time::Instant),
}

static TRACING: OnceLock<Tracing> = OnceLock::new();

/// What [`init`] would refuse of the endpoint, checked before anything starts, as the
/// configuration is: it must be an http:// URL.
pub fn check(endpoint: &str) -> Result<(), String> {
    export::check(endpoint)
}

/// What [`init`] would refuse of `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS` (they must parse),
/// checked apart from the endpoint, whose source its error is said with.
pub fn check_headers() -> Result<(), String> {
    export::check_headers()
}

/// The tracer, if spans are exported: the one check on the request path when they are not.
#[inline]
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACING.get().map(|tracing| &tracing.tracer)
}

/// The most links, and the most events, one span keeps (past it the SDK counts the rest as
/// dropped, which the export carries).
const SPAN_LINKS_AND_EVENTS: u32 = 4096;

/// Starts exporting spans to `endpoint` (the full URL of the collector's traces endpoint) as
/// `service`. Call once, from inside the runtime the exports should use.
pub fn init(endpoint: &str, service: &str, ratio: f64) -> Result<(), String> {
    let resource = Resource::builder().with_service_name(service.to_string()).build();
    let processor = export::Queue::start(endpoint, resource.clone())?;
    let sampler = Linked(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(resource)
        // The SDK's default of 128 cut a request of 150 items' links to the batches it rode,
        // and a dead batch's `retry` events past the 127th: a request's items are bounded by
        // the queue's capacity (1,024 by default), a batch's jobs by --max-batch-size.
        .with_max_links_per_span(SPAN_LINKS_AND_EVENTS)
        .with_max_events_per_span(SPAN_LINKS_AND_EVENTS)
        .build();
    let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "corral");
    let base = (SystemTime::now(), std::time::Instant::now());
    TRACING
        .set(Tracing { tracer, provider, base })
        .map_err(|_| "tracing was already started".to_string())
}

/// Exports what is queued (for up to a few seconds) and stops exporting; at the proxy's exit,
/// while its runtime still runs.
pub fn shutdown() {
    if let Some(tracing) = TRACING.get() {
        // A collector that does not answer holds the exit this long after the drain.
        if let Err(e) = tracing.provider.shutdown_with_timeout(export::FLUSH_WAIT) {
            tracing::warn!(error = %e, "the span exporter did not stop in time; exiting without it");
        }
    }
}

/// An instant on the wall clock.
fn wall(at: Instant) -> SystemTime {
    let (system, monotonic) = TRACING
        .get()
        .map_or_else(|| (SystemTime::now(), std::time::Instant::now()), |tracing| tracing.base);
    let at = at.into_std();
    match at.checked_duration_since(monotonic) {
        Some(after) => system + after,
        None => system - monotonic.duration_since(at),
    }
}

/// The request's server span, the child of the client's `traceparent` (and `tracestate`) if it
/// sent one, else the root of a new trace; None when tracing is off.
pub fn request(headers: &HeaderMap, method: &http::Method) -> Option<Context> {
    let tracer = tracer()?;
    let parent = TraceContextPropagator::new().extract(&Headers::new(headers));
    let mut attributes = Vec::with_capacity(2);
    let known = method_name(method);
    attributes.push(KeyValue::new("http.request.method", known.unwrap_or(OTHER_METHOD)));
    if known.is_none() {
        // A method is token characters, ASCII: any byte is a boundary.
        let original = method.as_str();
        let shown = &original[..original.len().min(MAX_METHOD_SHOWN)];
        attributes.push(KeyValue::new("http.request.method_original", shown.to_string()));
    }
    let span = tracer
        .span_builder(span_method(method))
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    Some(parent.with_span(span))
}

/// What OpenTelemetry's HTTP conventions call a method that is none of HTTP's own: any method
/// a client sends had become a span name of its own (20,000 characters of one, too).
const OTHER_METHOD: &str = "_OTHER";
/// The most of an unknown method kept, as `http.request.method_original`.
const MAX_METHOD_SHOWN: usize = 64;

/// An HTTP method's own name, if it is one of HTTP's (RFC 9110 and PATCH), without an
/// allocation: every span name and attribute on the request path is built per request.
fn method_name(method: &http::Method) -> Option<&'static str> {
    use http::Method;
    let known = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::PATCH,
        Method::CONNECT,
        Method::TRACE,
    ];
    let names = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE"];
    known.iter().position(|m| m == method).map(|i| names[i])
}

/// A span name's method part: `HTTP` for a method that is none of HTTP's own.
fn span_method(method: &http::Method) -> &'static str {
    method_name(method).unwrap_or("HTTP")
}

/// Names the request's span after its route, with its status and request id. A path that is no
/// route (the metrics' `other`) leaves the name the method alone and sets no `http.route`, as
/// OpenTelemetry's HTTP conventions ask: `other` is a label, not a route.
pub fn answered(cx: &Context, method: &http::Method, route: &str, status: u16, id: &str) {
    let span = cx.span();
    if route != "other" {
        span.update_name(format!("{} {route}", span_method(method)));
        span.set_attribute(KeyValue::new("http.route", route.to_string()));
    }
    span.set_attributes([
        KeyValue::new("http.response.status_code", i64::from(status)),
        KeyValue::new("corral.request_id", id.to_string()),
    ]);
    if status >= 500 {
        span.set_status(Status::error(""));
    }
}

/// Ends the request's span.
pub fn end(cx: &Context) {
    cx.span().end();
}

/// The span context a job carries to its batch (and, on the wire, to its worker).
pub fn job_context(cx: &Context) -> Box<SpanContext> {
    Box::new(cx.span().span_context().clone())
}

/// A span context as W3C `traceparent`, for the worker.
pub fn traceparent(context: &SpanContext) -> String {
    let flags = context.trace_flags().to_u8();
    format!("00-{}-{}-{flags:02x}", context.trace_id(), context.span_id())
}

/// A span context's W3C `tracestate`, if it has one.
pub fn tracestate(context: &SpanContext) -> Option<String> {
    let state = context.trace_state().header();
    (!state.is_empty()).then_some(state)
}

/// The admission of a request's jobs to a stage: admitted, or shed and why.
pub fn admission(cx: &Context, stage: &str, started: Instant, refused: Option<&Shed>) {
    let Some(tracer) = tracer() else { return };
    let why = refused.map(Shed::code);
    let attributes = [
        Some(KeyValue::new("corral.stage", stage.to_string())),
        Some(KeyValue::new("corral.shed", refused.is_some())),
        why.map(|why| KeyValue::new("corral.shed.reason", why)),
    ];
    let mut span = tracer
        .span_builder("admission")
        .with_start_time(wall(started))
        .with_attributes(attributes.into_iter().flatten())
        .start_with_context(tracer, cx);
    span.end();
}

/// A stage's queue wait for a request: from entering the queue until its (last) job's batch was
/// sent, linked to every batch its jobs rode in (`sent`: one entry per job that was dispatched;
/// a streamed job's is its latest batch).
fn queue_wait(
    cx: &Context,
    stage: &str,
    entered: Instant,
    sent: impl Iterator<Item = Sent> + Clone,
) {
    let Some(tracer) = tracer() else { return };
    let mut links: Vec<Link> = Vec::with_capacity(1);
    // Seen by id: a request of a thousand items riding as many batches compared each with
    // every link before it.
    let mut seen = std::collections::HashSet::new();
    for (trace_id, span_id) in sent.clone().filter_map(|sent| sent.span) {
        if seen.insert(span_id) {
            let context = SpanContext::new(
                trace_id,
                span_id,
                opentelemetry::trace::TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            );
            links.push(Link::with_context(context));
        }
    }
    let end = sent.clone().map(|sent| sent.at).max();
    let mut span = tracer
        .span_builder(format!("queue {stage}"))
        .with_start_time(wall(entered))
        .with_links(links)
        .with_attributes([
            KeyValue::new("corral.stage", stage.to_string()),
            KeyValue::new("corral.dispatched", end.is_some()),
            KeyValue::new(
                "corral.batch.size",
                sent.map(|s| s.batch_size).max().unwrap_or(0) as i64,
            ),
        ])
        .start_with_context(tracer, cx);
    span.end_with_timestamp(wall(end.unwrap_or_else(Instant::now)));
}

/// A traced request's `queue {stage}` span while its jobs wait: recorded by
/// [`QueueWait::record`] when the wait ends, or, if the wait is dropped first (its client left,
/// and hyper dropped the request's future), when dropped, from the batches its jobs rode so far.
/// Without it such a request had no queue span: nothing said whether its jobs were dispatched,
/// and its one link to their batch was gone (the batch's link to it led one way).
pub struct QueueWait {
    cx: Context,
    stage: String,
    entered: Instant,
    /// Each job's batch, as it is sent.
    slots: Vec<Arc<SentSlot>>,
    recorded: bool,
}

impl QueueWait {
    /// The guard of a request traced in `cx` (none if it is not) whose jobs entered `stage`
    /// at `entered`, each recording its batch in its slot.
    pub fn new(
        cx: Option<&Context>,
        stage: &str,
        entered: Instant,
        slots: Vec<Arc<SentSlot>>,
    ) -> Option<Self> {
        let cx = cx?.clone();
        Some(QueueWait { cx, stage: stage.to_string(), entered, slots, recorded: false })
    }

    /// Records the span now, with the batches the jobs were answered from.
    pub fn record(mut self, sent: impl Iterator<Item = Sent> + Clone) {
        self.recorded = true;
        queue_wait(&self.cx, &self.stage, self.entered, sent);
    }
}

impl Drop for QueueWait {
    fn drop(&mut self) {
        if !self.recorded {
            let sent = self.slots.iter().filter_map(|slot| slot.get());
            queue_wait(&self.cx, &self.stage, self.entered, sent);
        }
    }
}

/// The span of one batch, if a member of it is sampled: a root of its own (the batch is shared,
/// no one request's child), linked to every sampled member. Not to the others: their spans are
/// never exported, and a link to one led nowhere (a mixed batch linked to them all).
pub fn batch(stage: &str, pid: u32, jobs: &[Job]) -> Option<Span> {
    let tracer = tracer()?;
    // One link per request: the jobs of a request of several items share its context, and
    // each had linked it again.
    let mut seen = std::collections::HashSet::new();
    let links: Vec<Link> = jobs
        .iter()
        .filter_map(Job::trace)
        .filter(|context| context.is_sampled() && seen.insert(context.span_id()))
        .map(|context| Link::with_context(context.clone()))
        .collect();
    if links.is_empty() {
        // No member sampled: nor would the batch be (`Linked`); no span costs nothing.
        return None;
    }
    let span = tracer
        .span_builder(format!("batch {stage}"))
        .with_kind(SpanKind::Client)
        .with_links(links)
        .with_attributes([
            KeyValue::new("corral.stage", stage.to_string()),
            KeyValue::new("corral.batch.size", jobs.len() as i64),
            KeyValue::new("process.pid", i64::from(pid)),
        ])
        .start_with_context(tracer, &Context::new());
    Some(span)
}

/// The ids a batch's members link back to.
pub fn ids(span: &Span) -> (TraceId, SpanId) {
    let context = span.span_context();
    (context.trace_id(), context.span_id())
}

/// Notes on a batch's span that its worker failed with it (and why: `hung`, `died`, …, or
/// `closed` for a connection that ended with no failure while it held the batch); its jobs are
/// retried or answered 500.
pub fn worker_failed(span: &mut Span, failure: Option<WorkerFailure>, why: &str) {
    let name = match failure {
        Some(WorkerFailure::Hung) => "worker hung: killed",
        _ => "worker failed",
    };
    let reason = failure.map_or("closed", WorkerFailure::label);
    span.add_event(
        name,
        vec![KeyValue::new("corral.reason", reason), KeyValue::new("corral.why", why.to_string())],
    );
    span.set_status(Status::error(why.to_string()));
}

/// Notes on the span of a batch sent ahead that its worker got to it (was done with the batch
/// before): the span began when it was written.
pub fn started(span: &mut Span) {
    span.add_event("started", vec![]);
}

/// Notes on a batch's span that a job of it goes back to the queue for another worker.
pub fn retried(span: &mut Span, id: &str) {
    span.add_event("retry", vec![KeyValue::new("corral.request_id", id.to_string())]);
}

/// Samples a root span with links (a batch) if and only if it links to a sampled span (a batch
/// with a sampled member): drawn at the ratio of its own, a batch of unsampled members was
/// exported, linked to spans that never were. Any other span as the inner sampler says
/// (parent-based, then the ratio).
#[derive(Debug, Clone)]
struct Linked(Sampler);

impl ShouldSample for Linked {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let root = parent.is_none_or(|cx| !cx.has_active_span());
        if root && !links.is_empty() {
            let sampled = links.iter().any(|link| link.span_context.is_sampled());
            return SamplingResult {
                decision: if sampled {
                    SamplingDecision::RecordAndSample
                } else {
                    SamplingDecision::Drop
                },
                attributes: Vec::new(),
                trace_state: TraceState::default(),
            };
        }
        self.0.should_sample(parent, trace_id, name, kind, attributes, links)
    }
}

/// A request's headers as trace-context propagation reads them.
struct Headers<'a> {
    map: &'a HeaderMap,
    /// The client's `tracestate`, as kept ([`kept_tracestate`]).
    tracestate: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> Headers<'a> {
    fn new(map: &'a HeaderMap) -> Self {
        let mut fields = map.get_all("tracestate").iter().filter_map(|v| v.to_str().ok());
        let first = fields.next();
        let tracestate = match (first, fields.next()) {
            (None, _) => None,
            (Some(only), None) => Some(kept_tracestate(only)),
            // Several fields are one list, joined as HTTP joins a header's fields (W3C: they
            // must be combined); only the first had been kept.
            (Some(first), Some(second)) => {
                let all: Vec<&str> = [first, second].into_iter().chain(fields).collect();
                Some(kept_tracestate(&all.join(",")).into_owned().into())
            }
        };
        Self { map, tracestate }
    }
}

impl opentelemetry::propagation::Extractor for Headers<'_> {
    /// A header's value; a `traceparent` only if it has the W3C shape. The SDK's propagator
    /// parses the ids with `from_str_radix` and checks no length: `00-1-1-1`, 31 hex digits or a
    /// `+` became a parent, and went on to the worker. A client's malformed header is ignored
    /// (a new trace starts), as the W3C recommendation asks; so is a `traceparent` given in
    /// several fields (which parent is meant nobody can say; the first had been taken).
    fn get(&self, key: &str) -> Option<&str> {
        if key == "tracestate" {
            return self.tracestate.as_deref();
        }
        let mut fields = self.map.get_all(key).iter();
        let value = fields.next().and_then(|value| value.to_str().ok())?;
        if key == "traceparent" && fields.next().is_some() {
            return None;
        }
        (key != "traceparent" || well_formed_traceparent(value)).then_some(value)
    }

    fn keys(&self) -> Vec<&str> {
        self.map.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The most of a client's `tracestate` kept: W3C asks vendors to pass on at least 512
/// characters. Every span of the request carries it (into each export), and a legal 32 members
/// of 14.5 KB each made exports of 30 MB that a stalled collector held on to.
const MAX_TRACESTATE: usize = 512;
/// Members longer than this go first when the whole is cut (W3C's advice).
const LONG_MEMBER: usize = 128;

/// `tracestate` as kept: whole when within [`MAX_TRACESTATE`] bytes; else, as W3C advises,
/// without its members longer than [`LONG_MEMBER`], then its first members within the limit.
fn kept_tracestate(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= MAX_TRACESTATE {
        return value.into();
    }
    let mut kept = String::with_capacity(MAX_TRACESTATE);
    let members = value.split(',').map(|m| m.trim_matches([' ', '\t'])).filter(|m| !m.is_empty());
    for member in members.filter(|m| m.len() <= LONG_MEMBER) {
        let more = usize::from(!kept.is_empty()) + member.len();
        if kept.len() + more > MAX_TRACESTATE {
            break;
        }
        if !kept.is_empty() {
            kept.push(',');
        }
        kept.push_str(member);
    }
    kept.into()
}

/// A `traceparent` of the W3C shape: `version-trace_id-parent_id-flags`, lowercase hex of 2, 32,
/// 16 and 2 digits; version `ff` is invalid; version `00` is exactly that, a later version may
/// go on after a `-`. (All-zero ids are the propagator's to refuse.)
fn well_formed_traceparent(value: &str) -> bool {
    let b = value.as_bytes();
    if b.len() < 55 {
        return false;
    }
    let hex = |part: &[u8]| part.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let version = &b[0..2];
    let fields = [version, &b[3..35], &b[36..52], &b[53..55]];
    let dashes = b[2] == b'-' && b[35] == b'-' && b[52] == b'-';
    let rest = if version == b"00" { b.len() == 55 } else { b.len() == 55 || b[55] == b'-' };
    dashes && rest && version != b"ff" && fields.iter().all(|field| hex(field))
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceFlags;

    use super::*;

    fn link(sampled: bool) -> Link {
        let flags = if sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let context = SpanContext::new(
            TraceId::from(7u128),
            SpanId::from(3u64),
            flags,
            true,
            TraceState::default(),
        );
        Link::with_context(context)
    }

    fn decision(sampler: &Linked, links: &[Link]) -> SamplingDecision {
        let kind = SpanKind::Client;
        sampler.should_sample(None, TraceId::from(9u128), "batch", &kind, &[], links).decision
    }

    #[test]
    fn a_batch_is_sampled_exactly_when_a_member_is() {
        // At ratio 1 a root span is always sampled: not a batch of unsampled members.
        let every = Linked(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(1.0))));
        assert_eq!(decision(&every, &[link(false), link(false)]), SamplingDecision::Drop);
        assert_eq!(decision(&every, &[link(false), link(true)]), SamplingDecision::RecordAndSample);
        assert_eq!(decision(&every, &[]), SamplingDecision::RecordAndSample, "a request's span");
        let none = Linked(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(0.0))));
        assert_eq!(decision(&none, &[link(true)]), SamplingDecision::RecordAndSample);
        assert_eq!(decision(&none, &[]), SamplingDecision::Drop);
    }

    #[test]
    fn a_tracestate_keeps_its_first_members_within_512_bytes_long_ones_first_out() {
        let member = |i: usize| format!("k{i}={}", "v".repeat(100));
        let members: Vec<String> = (0..32).map(member).collect();
        let long = members.join(",");
        let kept = kept_tracestate(&long);
        assert!(kept.len() <= MAX_TRACESTATE, "{}", kept.len());
        assert_eq!(kept, members[..4].join(","), "whole members, dropped from the right");
        assert_eq!(kept_tracestate("a=1,b=2"), "a=1,b=2");
        let exactly = format!("k={}", "v".repeat(MAX_TRACESTATE - 2));
        assert_eq!(kept_tracestate(&exactly), exactly, "512 bytes are kept whole");
        // A member over 128 characters goes first: the short ones after it stay.
        let first_long = format!("k={}, short=1 ,other=2", "v".repeat(600));
        assert_eq!(kept_tracestate(&first_long), "short=1,other=2");
    }

    #[test]
    fn only_a_traceparent_of_the_w3c_shape_is_taken() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes";
        for value in [good, later] {
            assert!(well_formed_traceparent(value), "{value}");
        }
        for value in [
            "00-1-1-1",
            "00-af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", // 31 digits
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "+0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-",
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",
        ] {
            assert!(!well_formed_traceparent(value), "{value}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", "00-1-1-1".parse().unwrap());
        headers.insert("tracestate", "a=b".parse().unwrap());
        use opentelemetry::propagation::Extractor;
        assert_eq!(Headers::new(&headers).get("traceparent"), None);
        assert_eq!(Headers::new(&headers).get("tracestate"), Some("a=b"));
    }

    #[test]
    fn repeated_trace_fields_start_a_trace_and_join_their_states() {
        // W3C: two traceparents name no one parent; a tracestate's fields are one list.
        use opentelemetry::propagation::Extractor;
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", good.parse().unwrap());
        assert_eq!(Headers::new(&headers).get("traceparent"), Some(good));
        headers.append("traceparent", good.parse().unwrap());
        assert_eq!(Headers::new(&headers).get("traceparent"), None);
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2,c=3".parse().unwrap());
        assert_eq!(Headers::new(&headers).get("tracestate"), Some("a=1,b=2,c=3"));
    }
}
