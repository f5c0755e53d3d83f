"""The large-payload benchmark's MOSEC server (bench/payload.py): the same logic as Corral's
worker (bench/payload_worker.py), each request's size in bytes or, with BENCH_PAYLOAD_LOGIC=echo,
the request itself. BENCH_PAYLOAD_KIND says what requests are: `raw` bytes (MOSEC's `deserialize`
overridden to hand the body over as it came; its default parses JSON) or `json` (a list of
numbers, MOSEC's default JSON path). One worker, max batch 32, max wait 10 ms."""

import os

from mosec import Server, Worker

RAW = os.environ.get("BENCH_PAYLOAD_KIND", "raw") == "raw"
ECHO = os.environ.get("BENCH_PAYLOAD_LOGIC", "size") == "echo"


class Payload(Worker):
    resp_mime_type = "application/octet-stream" if RAW and ECHO else "application/json"

    def deserialize(self, data: bytes):
        return data if RAW else super().deserialize(data)

    def forward(self, data: list) -> list:  # a list: max batch is above 1
        return [item if ECHO else len(item) for item in data]

    def serialize(self, data) -> bytes:
        return data if RAW and ECHO else super().serialize(data)


if __name__ == "__main__":
    server = Server()
    server.append_worker(Payload, num=1, max_batch_size=32, max_wait_time=10)
    server.run()
