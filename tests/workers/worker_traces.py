"""Sets up OpenTelemetry's SDK as an application would, for the test workers that export their
own spans: an OTLP/HTTP exporter to TRACED_ENDPOINT (the tests' receiver), as service `worker`.
Importing it installs the provider; `user` is a tracer for the worker's own spans."""

import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "worker"}))
provider.add_span_processor(
    SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["TRACED_ENDPOINT"]))
)
trace.set_tracer_provider(provider)
user = trace.get_tracer("user")
