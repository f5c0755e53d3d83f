"""A real OTLP/HTTP receiver for tests: it takes `POST /v1/traces` bodies of OTLP/protobuf and
decodes them with OpenTelemetry's own `opentelemetry-proto` package (not Corral's code), keeping
every span it was sent, from the proxy and from workers alike."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start: int
    end: int
    attributes: dict
    links: list[tuple[str, str]]
    events: list[str] = field(default_factory=list)


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver:
    def __init__(self, status: int = 200) -> None:
        """`status`: what it answers each export (after decoding it), 200 or an error."""
        self.spans: list[Span] = []
        self.exports: list[int] = []  # the number of spans in each export, in order
        self.headers: list[dict[str, str]] = []  # each export's headers, lower-cased names
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request)
                with receiver._lock:
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _take(self, request) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        Span(
                            service=resource.get("service.name", ""),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            events=[event.name for event in s.events],
                        )
                    )
        with self._lock:
            self.spans.extend(spans)
            self.exports.append(len(spans))

    def wait_for(self, condition, timeout: float = 15, what: str = "spans") -> list[Span]:
        """Waits until `condition(spans)` holds (spans are exported in batches, after a delay)."""
        give_up = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if condition(spans):
                return spans
            if time.monotonic() > give_up:
                raise AssertionError(f"no {what} after {timeout}s; got {spans}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
