"""Generate: text generation streamed character by character, the whole batch stepped at once.

At start the worker trains the character model of model.py on the Python Language Reference text
that ships with Python (about a second, nothing downloaded). Each request is
`{"prompt": "...", "max_tokens": N}` (optionally `"seed"`); each chunk is the next character.

    curl -N localhost:8000/infer -H 'accept: text/event-stream' \\
        -H 'content-type: application/json' -d '{"prompt": "The ", "max_tokens": 80}'
"""

# DRAFT until the streaming API of issue #13 lands in the corral package: `forward` as a
# generator, `corral.END` and `self.cancelled` are used as the issue names them. Joining a running
# batch (`max_running`) is not wired yet: once its mechanism is settled, new items enter through
# `self.model.add(state, ...)` between steps and their positions are appended to `rows` below.

import itertools
import os
from typing import Annotated

import msgspec
from model import Model, corpus  # this directory is on sys.path: the worker runs as a script

import corral


class Prompt(msgspec.Struct, forbid_unknown_fields=True):
    """Text to continue, how many characters to generate, and optionally the sampling seed."""

    prompt: Annotated[str, msgspec.Meta(max_length=10_000)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    seed: int | None = None


class Generate(corral.Worker):
    input_type = Prompt

    def __init__(self) -> None:
        self.model = Model.train(corpus())
        self.seeds = itertools.count()  # a different text per request unless it names a seed

    def forward(self, batch: list[Prompt]):
        state = self.model.start(
            [item.prompt for item in batch],
            [next(self.seeds) if item.seed is None else item.seed for item in batch],
        )
        rows = list(range(len(batch)))  # rows[r]: the batch position of the model's row r
        left = [item.max_tokens for item in batch]
        ending: list[int] = []  # positions whose last character went out in the previous yield
        while rows:
            # Stop computing for clients that left: their rows leave the model's batch.
            gone = [r for r, position in enumerate(rows) if position in self.cancelled]
            if gone:
                self.model.remove(state, gone)
                rows = [position for position in rows if position not in self.cancelled]
                if not rows:
                    break
            chunks: list = [None] * len(batch)
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
            yield chunks
        # Returning ends every stream still open (the last finishers and the cancelled).


if __name__ == "__main__":
    if "GENERATE_MAX_RUNNING" in os.environ:  # bench/stream.py's corral-join (draft, see above)
        Generate.max_running = int(os.environ["GENERATE_MAX_RUNNING"])
    Generate.run()
