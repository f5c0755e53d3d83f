"""A worker that exports its own spans: OpenTelemetry's SDK and OTLP/HTTP exporter, configured
as an application would, sending to TRACED_ENDPOINT (the tests' receiver) as service `worker`.
The Python package adds `forward`, `preprocess` and `postprocess` spans that continue the
proxy's traces; `forward` here opens a span of its own (`user work`), which must land inside.
Every answer is `{"echo": item, "batch_size": n, "pid": pid}`. An item `{"hold": path}` holds
its batch until that file exists (the test creates it once the jobs it wants batched are queued).
"""

import os
import time

from worker_traces import user

from corral import Worker


class Traced(Worker):
    def forward(self, batch):
        for item in batch:
            while isinstance(item, dict) and "hold" in item and not os.path.exists(item["hold"]):
                time.sleep(0.005)
        with user.start_as_current_span("user work"):
            return [{"echo": item, "batch_size": len(batch), "pid": os.getpid()} for item in batch]


if __name__ == "__main__":
    Traced.run()
