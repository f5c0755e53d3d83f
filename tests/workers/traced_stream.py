"""The streaming twin of `traced.py`: OpenTelemetry's SDK exporting to TRACED_ENDPOINT as service
`worker`, and a `forward` generator that yields each item's text one character at a time,
opening a span of its own (`user step`) at every step, which must land inside the package's
`forward` span."""

import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from corral import Worker

provider = TracerProvider(resource=Resource.create({"service.name": "worker"}))
provider.add_span_processor(
    SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["TRACED_ENDPOINT"]))
)
trace.set_tracer_provider(provider)
user = trace.get_tracer("user")


class TracedStream(Worker):
    def forward(self, batch):
        for step in range(max(len(item["text"]) for item in batch)):
            with user.start_as_current_span("user step"):
                yield [item["text"][step] if step < len(item["text"]) else None for item in batch]


if __name__ == "__main__":
    TracedStream.run()
