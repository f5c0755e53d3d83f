"""A small character-level language model that generates text for a whole running batch at once.

The text it learns from ships with Python: the Python Language Reference topics that `help()`
shows (`pydoc_data.topics`, about 465,000 characters for Python 3.11), so nothing is downloaded.
Training counts character n-grams (order 5 by default) and smooths them with Witten-Bell
interpolation, in numpy, in about a second. The output reads like shuffled reference prose.

The API a server needs for streaming:

- `Model.train(text)` builds a model;
- `model.start(prompts, seeds)` returns a `State`, one row per prompt;
- `model.step(state)` advances every row by one character and returns them (one numpy pass for
  the whole batch, whatever its size);
- `model.add(state, prompts, seeds)` appends rows (a job joining a running batch) and
  `model.remove(state, positions)` drops rows (finished or cancelled jobs).

Sampling is seeded per row with a counter-based hash of (seed, step), so a row's text depends
only on its prompt and seed: a batch of 32 produces exactly what 32 runs of one produce.

Per-step cost: a real model's decoding step costs milliseconds and hardly more for 32 rows than
for one (on a GPU, reading the weights dominates). The n-gram lookup alone costs microseconds, so
each step also runs a hidden layer (`hidden` wide, tanh, recurrent) over the rows padded up to a
multiple of `block` rows, as GPU servers run fixed batch shapes: its cost is a floor per block of
rows (`hidden=1536`, the default: 1.5 to 3.7 ms per step of up to 32 rows on one core of the
2-core machine this was written on, depending on its other load). The
characters come from the n-gram tables only, so the hidden layer never changes them — which also
keeps rows independent bit for bit, as BLAS may sum in another order at another shape.
`hidden=0` turns it off.
"""

from __future__ import annotations

import os

# One BLAS thread: the hidden layer's cost must not depend on how many cores are free, and a
# server's worker shares the machine with the proxy. Set before numpy is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from dataclasses import dataclass

import numpy as np

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def corpus() -> str:
    """The training text: every topic of the Python Language Reference that ships with Python
    (`pydoc_data.topics`), in name order, separated by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def _uniform(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """A uniform number in [0, 1) per row from (seed, step): splitmix64, vectorized. Counter-based
    so that a row's draws do not depend on which other rows share its batch."""
    with np.errstate(over="ignore"):
        z = seeds * np.uint64(0x9E3779B97F4A7C15) + steps * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class State:
    """The running batch: one row per stream, in batch order."""

    context: np.ndarray  # (rows, order - 1) character ids, the last characters of each row
    seeds: np.ndarray  # (rows,) uint64
    steps: np.ndarray  # (rows,) uint64: characters generated so far
    hidden: np.ndarray  # (rows, hidden) float32: the cost-floor layer's activations

    def __len__(self) -> int:
        return len(self.seeds)


class Model:
    """Character n-gram tables (a cumulative distribution per seen context, for each context
    length) plus the hidden layer that gives a step its cost floor."""

    def __init__(
        self,
        alphabet: str,
        keys: list[np.ndarray],
        cdfs: list[np.ndarray],
        hidden: int,
        block: int,
    ) -> None:
        self.alphabet = alphabet
        self.index = {c: i for i, c in enumerate(alphabet)}
        self.keys = keys  # keys[n]: sorted ids of the contexts of length n (keys[0] = [0])
        self.cdfs = cdfs  # cdfs[n][k]: cumulative next-character distribution after keys[n][k]
        self.order = len(keys)
        self.block = block
        rng = np.random.default_rng(0)
        # The hidden layer's weights are fixed random: only their cost matters (see above).
        self.weights = (rng.standard_normal((hidden, hidden)) / max(hidden, 1) ** 0.5).astype(
            np.float32
        )
        self.embedding = rng.standard_normal((len(alphabet), hidden)).astype(np.float32)

    @classmethod
    def train(
        cls,
        text: str,
        order: int = 5,
        temperature: float = 0.8,
        hidden: int = 1536,
        block: int = 32,
    ) -> Model:
        """Count the n-grams of `text` up to `order` characters, smooth them (Witten-Bell), and
        sharpen them by `temperature` (below 1: fewer odd characters)."""
        alphabet = "".join(sorted(set(text)))
        size = len(alphabet)
        lookup = np.zeros(0x110000, dtype=np.int64)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        lookup[[ord(c) for c in alphabet]] = np.arange(size)
        ids = lookup[codes]

        unigram = np.bincount(ids, minlength=size).astype(np.float64)
        probs = [unigram[None, :] / unigram.sum()]
        keys = [np.zeros(1, dtype=np.int64)]
        key = np.zeros(len(ids), dtype=np.int64)  # key[i]: the n characters before position i
        for n in range(1, order):
            # Context of length n ending before i, as a base-`size` number (oldest digit first).
            key[n:] += ids[: len(ids) - n] * size ** (n - 1)  # prepend the older character
            pairs, counts = np.unique(key[n:] * size + ids[n:], return_counts=True)
            contexts, row = np.unique(pairs // size, return_inverse=True)
            table = np.zeros((len(contexts), size))
            table[row, pairs % size] = counts
            # Witten-Bell: mix with the shorter context by how many different characters follow.
            total, types = table.sum(1, keepdims=True), (table > 0).sum(1, keepdims=True)
            shorter = np.searchsorted(keys[n - 1], contexts % size ** (n - 1))
            probs.append((table + types * probs[n - 1][shorter]) / (total + types))
            keys.append(contexts)
        cdfs = []
        for p in probs:
            p = p ** (1 / temperature)
            cdfs.append(np.cumsum(p / p.sum(1, keepdims=True), axis=1).astype(np.float32))
        return cls(alphabet, keys, cdfs, hidden, block)

    # -- the running batch ------------------------------------------------------------------

    def start(self, prompts: list[str], seeds: list[int] | None = None) -> State:
        """A state with one row per prompt. Seeds default to 0, 1, 2, …"""
        state = State(
            context=np.zeros((0, self.order - 1), dtype=np.int64),
            seeds=np.zeros(0, dtype=np.uint64),
            steps=np.zeros(0, dtype=np.uint64),
            hidden=np.zeros((0, self.weights.shape[0]), dtype=np.float32),
        )
        self.add(state, prompts, list(range(len(prompts))) if seeds is None else seeds)
        return state

    def add(self, state: State, prompts: list[str], seeds: list[int]) -> None:
        """Append rows (their positions follow the existing ones). A prompt is read as if it
        began a paragraph; characters the model never saw count as spaces."""
        pad = self.index.get("\n", 0)
        space = self.index.get(" ", 0)
        width = self.order - 1
        rows = np.full((len(prompts), width), pad, dtype=np.int64)
        for r, prompt in enumerate(prompts):
            tail = [self.index.get(c, space) for c in prompt[-width:]] if width else []
            rows[r, width - len(tail) :] = tail
        state.context = np.concatenate([state.context, rows])
        state.seeds = np.concatenate([state.seeds, np.array(seeds, dtype=np.uint64) & _MASK])
        state.steps = np.concatenate([state.steps, np.zeros(len(prompts), dtype=np.uint64)])
        fresh = np.zeros((len(prompts), self.weights.shape[0]), dtype=np.float32)
        state.hidden = np.concatenate([state.hidden, fresh])

    def remove(self, state: State, positions: list[int] | set[int]) -> None:
        """Drop the rows at `positions`; the others keep their order (and close up)."""
        keep = np.ones(len(state), dtype=bool)
        keep[list(positions)] = False
        state.context = state.context[keep]
        state.seeds = state.seeds[keep]
        state.steps = state.steps[keep]
        state.hidden = state.hidden[keep]

    def step(self, state: State) -> list[str]:
        """Advance every row by one character; return the new characters, in row order."""
        rows = len(state)
        if rows == 0:
            return []
        # The longest context seen in training, per row: try the longest first.
        found = np.zeros(rows, dtype=bool)
        cdf = np.empty((rows, len(self.alphabet)), dtype=np.float32)
        size = len(self.alphabet)
        key = np.zeros(rows, dtype=np.int64)
        keys_by_length = [key.copy()]
        for n in range(1, self.order):  # key of the last n characters, built newest digit last
            key = key + state.context[:, self.order - 1 - n] * size ** (n - 1)
            keys_by_length.append(key)
        for n in range(self.order - 1, -1, -1):
            todo = ~found
            if not todo.any():
                break
            table = self.keys[n]
            at = np.minimum(np.searchsorted(table, keys_by_length[n][todo]), len(table) - 1)
            hit = table[at] == keys_by_length[n][todo]
            where = np.flatnonzero(todo)[hit]
            cdf[where] = self.cdfs[n][at[hit]]
            found[where] = True
        u = _uniform(state.seeds, state.steps).astype(np.float32) * cdf[:, -1]
        chosen = np.minimum((cdf <= u[:, None]).sum(1), size - 1)
        state.context = np.concatenate([state.context[:, 1:], chosen[:, None]], axis=1)
        state.steps += np.uint64(1)
        self._hidden_step(state, chosen)
        return [self.alphabet[c] for c in chosen]

    def _hidden_step(self, state: State, chosen: np.ndarray) -> None:
        """The cost floor (module docstring): one recurrent tanh layer over the rows padded up to
        a multiple of `block`, as a GPU server runs a fixed batch shape."""
        if self.weights.shape[0] == 0:
            return
        rows = len(state)
        padded = np.zeros((-(-rows // self.block) * self.block, self.weights.shape[0]), np.float32)
        padded[:rows] = state.hidden
        state.hidden = np.tanh(padded @ self.weights)[:rows] + self.embedding[chosen]


def _report() -> None:
    """`python examples/generate/model.py`: a sample, and what one step costs by batch size."""
    import time

    started = time.perf_counter()
    model = Model.train(corpus())
    print(f"trained in {time.perf_counter() - started:.2f} s on {len(corpus()):,} characters")
    state = model.start(["The "], seeds=[1])
    print("The " + "".join(model.step(state)[0] for _ in range(200)), end="\n\n")
    cost = {}
    for rows in (1, 8, 32, 64):
        state = model.start(["The "] * rows)
        for _ in range(20):  # warm-up
            model.step(state)
        started = time.perf_counter()
        for _ in range(200):
            model.step(state)
        cost[rows] = (time.perf_counter() - started) / 200
        rate = rows / cost[rows]
        print(f"batch {rows:2}: {cost[rows] * 1000:6.2f} ms a step, {rate:8,.0f} chars/s")
    print(f"32 steps of 1 cost {32 * cost[1] / cost[32]:.1f}× one step of 32")


if __name__ == "__main__":
    _report()
