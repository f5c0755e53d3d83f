"""Generate: text generation streamed character by character, the whole batch stepped at once.

At start the worker trains the character model of model.py on the Python Language Reference text
that ships with Python (about a second, nothing downloaded). Each request is
`{"prompt": "...", "max_tokens": N}` (optionally `"seed"`); each chunk is the next character.

    curl -N localhost:8000/infer -H 'accept: text/event-stream' \\
        -H 'content-type: application/json' -d '{"prompt": "The ", "max_tokens": 80}'
"""

# Joining: with `max_running` set (32 here; GENERATE_MAX_RUNNING overrides it, 0 turns joining
# off), requests that arrive while a batch is generating join it between two steps instead of
# waiting for its slowest stream. Each `yield` returns the inputs that joined; they take the next
# positions and the next rows of the model.

import itertools
import os
from typing import Annotated, Optional

import msgspec
from model import Model, corpus  # this directory is on sys.path: the worker runs as a script

import corral


class Prompt(msgspec.Struct, forbid_unknown_fields=True):
    """Text to continue, how many characters to generate, and optionally the sampling seed."""

    prompt: Annotated[str, msgspec.Meta(max_length=10_000)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    # The model's generators take unsigned 64-bit seeds (the proxy refuses JSON integers past
    # 64 bits): a negative one is the request's 422, not an error for every stream of its batch.
    # Optional[...] rather than `| None`: Python 3.9 (the package's floor) cannot evaluate that.
    seed: Optional[Annotated[int, msgspec.Meta(ge=0)]] = None


class Generate(corral.Worker):
    input_type = Prompt
    max_running = 32

    def __init__(self) -> None:
        self.model = Model.train(corpus())
        self.seeds = itertools.count()  # a different text per request unless it names a seed

    def forward(self, batch: list[Prompt]):
        items = list(batch)
        state = self.model.start([item.prompt for item in items], self.seeds_for(items))
        rows = list(range(len(items)))  # rows[r]: the position of the model's row r
        left = [item.max_tokens for item in items]
        ending: list[int] = []  # positions whose last character went out in the previous yield
        while rows or ending:
            # Stop computing for clients that left: their rows leave the model's batch.
            gone = [r for r, position in enumerate(rows) if position in self.cancelled]
            if gone:
                self.model.remove(state, gone)
                rows = [position for position in rows if position not in self.cancelled]
            chunks: list = [None] * len(items)
            for position in ending:
                chunks[position] = corral.END
            finished = []
            for r, (position, char) in enumerate(zip(rows, self.model.step(state))):
                chunks[position] = char
                left[position] -= 1
                if left[position] == 0:
                    finished.append(r)
            ending = [rows[r] for r in finished]
            self.model.remove(state, finished)
            rows = [position for r, position in enumerate(rows) if r not in finished]
            joined = yield chunks
            if joined:
                rows += range(len(items), len(items) + len(joined))
                items += joined
                left += [item.max_tokens for item in joined]
                self.model.add(state, [item.prompt for item in joined], self.seeds_for(joined))
        # Returning ends every stream still open.

    def seeds_for(self, items: list[Prompt]) -> list[int]:
        return [next(self.seeds) if item.seed is None else item.seed for item in items]


if __name__ == "__main__":
    if "GENERATE_MAX_RUNNING" in os.environ:
        Generate.max_running = int(os.environ["GENERATE_MAX_RUNNING"]) or None
    Generate.run()
