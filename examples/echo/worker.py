"""Echo: the smallest Corral worker. Each item comes back as it was sent.

Run it behind the proxy with
`target/release/corral --workers 2 -- .venv/bin/python examples/echo/worker.py`
(`make run` serves the digits model instead), then:

    curl -s localhost:8000/infer -H 'content-type: application/json' -d '{"hello": "world"}'
"""

import corral


class Echo(corral.Worker):
    def forward(self, batch: list) -> list:
        return batch


if __name__ == "__main__":
    Echo.run()
