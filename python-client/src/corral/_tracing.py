"""Optional OpenTelemetry spans in a worker, continuing the traces of the requests it serves.

When the proxy traces a request it sends the job's W3C ``traceparent`` (and ``tracestate``) in
the batch frame. If the ``opentelemetry`` API is installed (the ``otel`` extra:
``pip install "./python-client[otel]"`` from the repository)
the worker then opens, under the application's own tracer provider:

- ``forward``: one span per batch, the child of its first sampled job's context and linked to
  every sampled job's (the first traced job's when none is sampled), so that a user's own spans
  inside ``forward`` land in a request's trace;
- ``preprocess`` / ``postprocess``: one span per item, the child of its job's context.

A streaming worker's ``forward`` span lasts as long as the stream of the batch that started it.

Without the package, for jobs that carry no ``traceparent``, or with the API but no tracer
provider configured (spans would be no-ops), nothing happens: each hook costs one dict lookup.
Exporting is the application's choice: an SDK and an exporter, configured as usual before
``Worker.run()`` (the provider is looked up once, at the first traced job).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

_NOTHING = contextlib.nullcontext()
_api: Any = None  # the loaded API (a tuple), False when it is not installed


def _load() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _api = False
        else:
            # The API alone makes no-op spans; building them for every item would cost a worker
            # several times its own work for nothing (measured: 5x the CPU on the echo bench).
            provider = trace.get_tracer_provider()
            if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
                _api = False
            else:
                tracer = trace.get_tracer("corral.worker")
                _api = (trace, TraceContextTextMapPropagator(), tracer)
    return _api


def _context(job: dict[str, Any]) -> Any:
    """The job's trace context, or None when it has none (or the API is not installed)."""
    traceparent = job.get("traceparent")
    if not isinstance(traceparent, str):
        return None
    api = _load()
    if not api:
        return None
    carrier = {"traceparent": traceparent}
    tracestate = job.get("tracestate")
    if isinstance(tracestate, str):
        carrier["tracestate"] = tracestate
    return api[1].extract(carrier)


def item(job: dict[str, Any], name: str) -> contextlib.AbstractContextManager[Any]:
    """A span around one item's ``preprocess`` or ``postprocess``, if its job is traced."""
    if "traceparent" not in job:
        return _NOTHING
    context = _context(job)
    if context is None:
        return _NOTHING
    return _api[2].start_as_current_span(name, context=context)


def batch(jobs: Sequence[dict[str, Any]]) -> contextlib.AbstractContextManager[Any]:
    """A span around ``forward`` for a batch, if any of its jobs is traced."""
    if not any("traceparent" in job for job in jobs):
        return _NOTHING
    contexts = [c for c in (_context(job) for job in jobs) if c is not None]
    if not contexts:
        return _NOTHING
    return _forward(contexts, len(jobs))


@contextlib.contextmanager
def _forward(contexts: list[Any], size: int) -> Iterator[Any]:
    trace, _, tracer = _api
    spans = [trace.get_current_span(c).get_span_context() for c in contexts]
    # The parent is the first *sampled* job's: under a parent-based sampler the first job's
    # unsampled flag made the whole `forward` (and the user's spans in it) unrecorded for the
    # sampled jobs beside it. Links go to sampled spans only, which are the ones exported.
    sampled = [i for i, span in enumerate(spans) if span.trace_flags.sampled] or range(len(spans))
    # One link per span: the items of one request share their request's, and had one each.
    linked = {(spans[i].trace_id, spans[i].span_id): spans[i] for i in sampled}
    with tracer.start_as_current_span(
        "forward",
        context=contexts[sampled[0]],
        links=[trace.Link(span) for span in linked.values()],
        attributes={"corral.batch.size": size},
    ) as span:
        yield span
