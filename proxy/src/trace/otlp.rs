//! The OTLP/protobuf body of one export: the SDK's ended spans written straight into an
//! `ExportTraceServiceRequest` with prost's wire primitives.
//!
//! Why not opentelemetry-proto's conversion: it turns every span into owned protobuf structs
//! first — a `Vec` for each id, a `String` for each name, key and value, a struct for each link —
//! about fifteen allocations a span, freed again once prost has encoded them, and prost measures
//! each nested message once per level above it. At three spans a request that was most of
//! tracing's cost (BENCHMARKS.md, "Tracing targets"; docs/ARCHITECTURE.md, dependencies). Here
//! nothing is allocated but the body. The bytes are the same as that conversion followed by
//! prost's encoding: field by field, in tag order, with prost's rules for defaults (a proto3
//! scalar equal to its default is left out; a set message or `oneof` is always written). A test
//! checks that against opentelemetry-proto itself, for spans with every kind of field.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{Event, Link, SpanContext, SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

/// Writes a message's fields into the body, or only counts their bytes: a length-delimited
/// field's length goes before it, so each nested message is counted, then written.
struct Out {
    body: Vec<u8>,
    counting: bool,
    counted: usize,
}

impl Out {
    fn raw(&mut self, bytes: &[u8]) {
        if self.counting {
            self.counted += bytes.len();
        } else {
            self.body.extend_from_slice(bytes);
        }
    }

    fn key(&mut self, tag: u32, wire: WireType) {
        if self.counting {
            self.counted += key_len(tag);
        } else {
            encode_key(tag, wire, &mut self.body);
        }
    }

    fn varint(&mut self, value: u64) {
        if self.counting {
            self.counted += encoded_len_varint(value);
        } else {
            encode_varint(value, &mut self.body);
        }
    }

    /// The bytes `fields` writes.
    fn count(&mut self, fields: impl Fn(&mut Self)) -> usize {
        let (counting, counted) = (self.counting, self.counted);
        self.counting = true;
        self.counted = 0;
        fields(self);
        let len = self.counted;
        (self.counting, self.counted) = (counting, counted);
        len
    }

    /// A length-delimited field whose contents `fields` writes.
    fn message(&mut self, tag: u32, fields: impl Fn(&mut Self)) {
        let len = self.count(&fields);
        self.length(tag, len);
        if self.counting {
            self.counted += len;
        } else {
            fields(self);
        }
    }

    /// A length-delimited field's key and length; its `len` bytes are written next.
    fn length(&mut self, tag: u32, len: usize) {
        self.key(tag, WireType::LengthDelimited);
        self.varint(len as u64);
    }

    fn bytes(&mut self, tag: u32, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.length(tag, bytes.len());
            self.raw(bytes);
        }
    }

    fn uint(&mut self, tag: u32, value: u64) {
        if value != 0 {
            self.key(tag, WireType::Varint);
            self.varint(value);
        }
    }

    fn fixed64(&mut self, tag: u32, value: u64) {
        if value != 0 {
            self.key(tag, WireType::SixtyFourBit);
            self.raw(&value.to_le_bytes());
        }
    }

    fn fixed32(&mut self, tag: u32, value: u32) {
        if value != 0 {
            self.key(tag, WireType::ThirtyTwoBit);
            self.raw(&value.to_le_bytes());
        }
    }
}

/// The bytes a length-delimited field of `len` bytes takes, key and length included.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// Nanoseconds since the epoch, as opentelemetry-proto gives them (0 before it).
fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Span and link flags: the W3C trace flags, plus "whether the parent was remote is known" and
/// whether it was (`SpanFlags` in trace.proto).
fn flags(remote: bool, trace_flags: u8) -> u32 {
    const HAS_IS_REMOTE: u32 = 0x100;
    const IS_REMOTE: u32 = 0x200;
    u32::from(trace_flags) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// `string` fields: written as bytes (proto3 leaves an empty one out).
fn string(out: &mut Out, tag: u32, value: &str) {
    out.bytes(tag, value.as_bytes());
}

/// An `AnyValue`'s `oneof`, always written when set, default or not.
fn any_value(out: &mut Out, value: &Value) {
    match value {
        Value::String(s) => string_value(out, s),
        Value::Bool(b) => {
            out.key(2, WireType::Varint);
            out.varint(u64::from(*b));
        }
        Value::I64(i) => {
            out.key(3, WireType::Varint);
            out.varint(*i as u64);
        }
        Value::F64(f) => {
            out.key(4, WireType::SixtyFourBit);
            out.raw(&f.to_bits().to_le_bytes());
        }
        Value::Array(array) => array_value(out, array),
        // A kind of value added to the API after this was written: sent as an empty value.
        _ => {}
    }
}

fn string_value(out: &mut Out, s: &StringValue) {
    out.length(1, s.as_str().len());
    out.raw(s.as_str().as_bytes());
}

fn array_value(out: &mut Out, array: &Array) {
    // ArrayValue { repeated AnyValue values = 1 }, in AnyValue's field 5.
    let values: Vec<Value> = match array {
        Array::Bool(v) => v.iter().copied().map(Value::Bool).collect(),
        Array::I64(v) => v.iter().copied().map(Value::I64).collect(),
        Array::F64(v) => v.iter().copied().map(Value::F64).collect(),
        Array::String(v) => v.iter().cloned().map(Value::String).collect(),
        _ => Vec::new(),
    };
    out.message(5, |out| {
        for value in &values {
            out.message(1, |out| any_value(out, value));
        }
    });
}

/// A `KeyValue` at `tag`: KeyValue { key = 1; AnyValue value = 2 (always set) }.
fn key_value(out: &mut Out, tag: u32, key: &str, value: &Value) {
    out.message(tag, |out| {
        string(out, 1, key);
        out.message(2, |out| any_value(out, value));
    });
}

fn attributes<'a>(out: &mut Out, tag: u32, attributes: impl Iterator<Item = &'a KeyValue>) {
    for kv in attributes {
        key_value(out, tag, kv.key.as_str(), &kv.value);
    }
}

fn resource(out: &mut Out, resource: &Resource) {
    // Resource { attributes = 1; dropped_attributes_count = 2; entity_refs = 3 }
    for (key, value) in resource.iter() {
        key_value(out, 1, key.as_str(), value);
    }
}

fn scope(out: &mut Out, scope: &InstrumentationScope) {
    // InstrumentationScope { name = 1; version = 2; attributes = 3; dropped = 4 }
    string(out, 1, scope.name());
    string(out, 2, scope.version().unwrap_or_default());
    attributes(out, 3, scope.attributes());
}

fn ids(out: &mut Out, context: &SpanContext) {
    out.bytes(1, &context.trace_id().to_bytes());
    out.bytes(2, &context.span_id().to_bytes());
    string(out, 3, &context.trace_state().header());
}

fn event(out: &mut Out, event: &Event) {
    out.fixed64(1, nanos(event.timestamp));
    string(out, 2, &event.name);
    attributes(out, 3, event.attributes.iter());
    out.uint(4, u64::from(event.dropped_attributes_count));
}

fn link(out: &mut Out, link: &Link) {
    ids(out, &link.span_context);
    attributes(out, 4, link.attributes.iter());
    out.uint(5, u64::from(link.dropped_attributes_count));
    let context = &link.span_context;
    out.fixed32(6, flags(context.is_remote(), context.trace_flags().to_u8()));
}

/// One span, its fields in tag order (as prost writes them).
fn span(out: &mut Out, span: &SpanData) {
    ids(out, &span.span_context);
    if span.parent_span_id != SpanId::INVALID {
        out.bytes(4, &span.parent_span_id.to_bytes());
    }
    string(out, 5, &span.name);
    out.uint(6, kind(&span.span_kind));
    out.fixed64(7, nanos(span.start_time));
    out.fixed64(8, nanos(span.end_time));
    attributes(out, 9, span.attributes.iter());
    out.uint(10, u64::from(span.dropped_attributes_count));
    for e in span.events.iter() {
        out.message(11, |out| event(out, e));
    }
    out.uint(12, u64::from(span.events.dropped_count));
    for l in span.links.iter() {
        out.message(13, |out| link(out, l));
    }
    out.uint(14, u64::from(span.links.dropped_count));
    // Status { message = 2; code = 3 }: always set.
    out.message(15, |out| {
        let (code, message) = match &span.status {
            Status::Unset => (0, ""),
            Status::Ok => (1, ""),
            Status::Error { description } => (2, description.as_ref()),
        };
        string(out, 2, message);
        out.uint(3, code);
    });
    out.fixed32(16, flags(span.parent_span_is_remote, span.span_context.trace_flags().to_u8()));
}

/// The spans of `of` in `spans`, with their lengths.
fn members<'a>(
    spans: &'a [SpanData],
    lens: &'a [usize],
    of: &'a InstrumentationScope,
) -> impl Iterator<Item = (&'a SpanData, &'a usize)> {
    spans.iter().zip(lens).filter(move |(s, _)| &s.instrumentation_scope == of)
}

/// The export request for `spans`, all from `resource`: one `ResourceSpans`, one `ScopeSpans` per
/// instrumentation scope (in the order each first appears). Each span is counted once, to size
/// the messages around it, then written.
pub fn encode(spans: &[SpanData], from: &Resource) -> Vec<u8> {
    let mut out = Out { body: Vec::new(), counting: true, counted: 0 };
    let lens: Vec<usize> = spans.iter().map(|s| out.count(|out| span(out, s))).collect();
    let mut scopes: Vec<&InstrumentationScope> = Vec::with_capacity(1);
    for s in spans {
        if !scopes.contains(&&s.instrumentation_scope) {
            scopes.push(&s.instrumentation_scope);
        }
    }
    // ScopeSpans { scope = 1; spans = 2; schema_url = 3 }
    let scope_lens: Vec<usize> = scopes
        .iter()
        .map(|&of| {
            out.count(|out| {
                out.message(1, |out| scope(out, of));
                string(out, 3, of.schema_url().unwrap_or_default());
            }) + members(spans, &lens, of).map(|(_, &len)| field_len(2, len)).sum::<usize>()
        })
        .collect();
    // ResourceSpans { resource = 1; scope_spans = 2; schema_url = 3 }
    let resource_len = out.count(|out| {
        out.message(1, |out| resource(out, from));
        string(out, 3, from.schema_url().unwrap_or_default());
    }) + scope_lens.iter().map(|&len| field_len(2, len)).sum::<usize>();

    // ExportTraceServiceRequest { resource_spans = 1 }
    out.body.reserve_exact(field_len(1, resource_len));
    out.counting = false;
    out.length(1, resource_len);
    out.message(1, |out| resource(out, from));
    for (&of, &scope_len) in scopes.iter().zip(&scope_lens) {
        out.length(2, scope_len);
        out.message(1, |out| scope(out, of));
        for (s, &len) in members(spans, &lens, of) {
            out.length(2, len);
            span(&mut out, s);
        }
        string(&mut out, 3, of.schema_url().unwrap_or_default());
    }
    string(&mut out, 3, from.schema_url().unwrap_or_default());
    out.body
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use opentelemetry::trace::{TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message;

    use super::*;

    fn context(trace: u128, span: u64, sampled: bool, remote: bool, state: &str) -> SpanContext {
        let flags = if sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let state = if state.is_empty() {
            TraceState::default()
        } else {
            state.parse().expect("a valid tracestate")
        };
        SpanContext::new(TraceId::from(trace), SpanId::from(span), flags, remote, state)
    }

    /// A span with every kind of field set, or left at its default (`bare`); sampled unless
    /// bare.
    pub(in crate::trace) fn span(n: u64, scope: &InstrumentationScope, bare: bool) -> SpanData {
        let at = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        let mut events = SpanEvents::default();
        let mut links = SpanLinks::default();
        if !bare {
            events.events = vec![
                Event::new("retry", at, vec![KeyValue::new("corral.request_id", "abc")], 1),
                Event::new("", UNIX_EPOCH, vec![], 0),
            ];
            events.dropped_count = 3;
            links.links = vec![
                Link::new(context(7, 8, true, true, "k=v,x=y"), vec![KeyValue::new("n", 1_i64)], 2),
                Link::with_context(context(1 << 100, u64::MAX, false, false, "")),
            ];
            links.dropped_count = 4;
        }
        let attributes = if bare {
            vec![]
        } else {
            vec![
                KeyValue::new("s", "text"),
                KeyValue::new("empty", ""),
                KeyValue::new("yes", true),
                KeyValue::new("no", false),
                KeyValue::new("zero", 0_i64),
                KeyValue::new("negative", -5_i64),
                KeyValue::new("f", 2.5_f64),
                KeyValue::new("f0", 0.0_f64),
                KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
                KeyValue::new("ints", Value::Array(Array::I64(vec![0, -1, i64::MAX]))),
                KeyValue::new("floats", Value::Array(Array::F64(vec![1.5]))),
                KeyValue::new("strings", Value::Array(Array::String(vec!["a".into(), "".into()]))),
                KeyValue::new("no values", Value::Array(Array::I64(vec![]))),
            ]
        };
        let kinds = [
            SpanKind::Internal,
            SpanKind::Server,
            SpanKind::Client,
            SpanKind::Producer,
            SpanKind::Consumer,
        ];
        let statuses = [Status::Unset, Status::Ok, Status::error("it broke"), Status::error("")];
        SpanData {
            span_context: context(u128::from(n) << 64 | 0xabc, n + 1, !bare, false, ""),
            parent_span_id: if bare { SpanId::INVALID } else { SpanId::from(n + 1000) },
            parent_span_is_remote: n.is_multiple_of(2),
            span_kind: kinds[n as usize % kinds.len()].clone(),
            name: if bare { "".into() } else { format!("span {n}").into() },
            start_time: at,
            end_time: if bare { UNIX_EPOCH } else { at + Duration::from_millis(3) },
            attributes,
            dropped_attributes_count: if bare { 0 } else { 9 },
            events,
            links,
            status: statuses[n as usize % statuses.len()].clone(),
            instrumentation_scope: scope.clone(),
        }
    }

    /// What opentelemetry-proto's own conversion and prost's encoding make of the same spans.
    fn expected(spans: &[SpanData], resource: &Resource) -> Vec<u8> {
        let attributes = ResourceAttributesWithSchema::from(resource);
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans.to_vec(), &attributes),
        }
        .encode_to_vec()
    }

    /// The same bytes; if not, where they part and what each decodes to.
    fn same(ours: &[u8], theirs: &[u8]) {
        if ours != theirs {
            let at = ours.iter().zip(theirs).take_while(|(a, b)| a == b).count();
            let around = |b: &[u8]| b[at.saturating_sub(16)..(at + 16).min(b.len())].to_vec();
            panic!(
                "the bodies part at byte {at} of {} and {}: ours …{:?}…, theirs …{:?}…\n\
                 ours decode to {:?}",
                ours.len(),
                theirs.len(),
                around(ours),
                around(theirs),
                ExportTraceServiceRequest::decode(ours).map(|r| r.resource_spans.len()),
            );
        }
    }

    #[test]
    fn the_body_is_byte_for_byte_what_opentelemetry_proto_encodes() {
        let corral = InstrumentationScope::builder("corral").build();
        let other = InstrumentationScope::builder("other")
            .with_version("1.2")
            .with_schema_url("https://opentelemetry.io/schemas/1.0")
            .with_attributes([KeyValue::new("scope", "attr")])
            .build();
        let resources = [
            Resource::builder_empty().build(),
            Resource::builder().with_service_name("corral").build(),
            Resource::builder_empty()
                .with_schema_url(
                    [KeyValue::new("service.name", "x"), KeyValue::new("n", 3_i64)],
                    "https://opentelemetry.io/schemas/1.1",
                )
                .build(),
        ];
        let batches: Vec<Vec<SpanData>> = vec![
            vec![],
            vec![span(0, &corral, true)],
            (0..12).map(|n| span(n, &corral, n % 5 == 3)).collect(),
            // Scopes interleaved: grouped in the order each first appears.
            (0..9).map(|n| span(n, if n % 3 == 1 { &other } else { &corral }, false)).collect(),
        ];
        for resource in &resources {
            for spans in &batches {
                same(&encode(spans, resource), &expected(spans, resource));
            }
        }
    }

    #[test]
    fn a_large_export_decodes_with_opentelemetry_proto() {
        let corral = InstrumentationScope::builder("corral").build();
        let spans: Vec<SpanData> = (0..3000).map(|n| span(n, &corral, false)).collect();
        let resource = Resource::builder().with_service_name("corral").build();
        let body = encode(&spans, &resource);
        same(&body, &expected(&spans, &resource));
        let decoded = ExportTraceServiceRequest::decode(body.as_slice()).expect("it decodes");
        let decoded = &decoded.resource_spans[0].scope_spans[0].spans;
        assert_eq!(decoded.len(), 3000);
        assert_eq!(decoded[2999].name, "span 2999");
        assert_eq!(decoded[2999].links.len(), 2);
    }
}
