"""The streaming twin of `traced.py`: OpenTelemetry's SDK exporting to TRACED_ENDPOINT as service
`worker`, and a `forward` generator that yields each item's text one character at a time,
opening a span of its own (`user step`) at every step, which must land inside the package's
`forward` span."""

from worker_traces import user

from corral import Worker


class TracedStream(Worker):
    def forward(self, batch):
        for step in range(max(len(item["text"]) for item in batch)):
            with user.start_as_current_span("user step"):
                yield [item["text"][step] if step < len(item["text"]) else None for item in batch]


if __name__ == "__main__":
    TracedStream.run()
