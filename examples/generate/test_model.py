"""The generation example's model (examples/generate/model.py): seeded and deterministic, a batch
equal to its rows run alone, rows added to and removed from a running batch."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as generate  # the example's module, imported by path as the worker does

PROMPTS = ["The ", "A class ", "", "def f(x):\n    return ", "Ünïcode → "]


@pytest.fixture(scope="module")
def model() -> generate.Model:
    # A small hidden layer keeps the tests fast; it never changes the characters anyway.
    return generate.Model.train(generate.corpus(), hidden=16, block=4)


def run(model: generate.Model, state: generate.State, steps: int) -> list[str]:
    texts = [""] * len(state)
    for _ in range(steps):
        for row, char in enumerate(model.step(state)):
            texts[row] += char
    return texts


def test_training_text_ships_with_python_and_trains_quickly():
    text = generate.corpus()
    assert len(text) > 100_000 and "class" in text


def test_same_seed_same_text_and_different_seeds_differ(model):
    first = run(model, model.start(["The "] * 2, seeds=[7, 8]), 60)
    again = run(model, model.start(["The "] * 2, seeds=[7, 8]), 60)
    assert first == again
    assert first[0] != first[1]
    assert all(len(text) == 60 for text in first)


def test_text_looks_like_the_training_text(model):
    text = "".join(run(model, model.start(["The "] * 4, seeds=[1, 2, 3, 4]), 200))
    words = [word for word in text.split() if word.isalpha()]
    corpus_words = set(generate.corpus().split())
    # Mostly real words: an order-5 model rarely strays from what it saw.
    assert sum(word in corpus_words for word in words) / len(words) > 0.6


def test_batch_of_32_equals_32_singles(model):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(32)]
    seeds = [1000 + i for i in range(32)]
    batch = run(model, model.start(prompts, seeds), 40)
    singles = [run(model, model.start([p], [s]), 40)[0] for p, s in zip(prompts, seeds)]
    assert batch == singles


def test_added_rows_continue_as_if_started_alone(model):
    state = model.start(["The "], seeds=[1])
    head = run(model, state, 10)
    model.add(state, ["A class ", "def "], seeds=[2, 3])
    rest = run(model, state, 20)
    assert head[0] + rest[0] == run(model, model.start(["The "], [1]), 30)[0]
    assert rest[1] == run(model, model.start(["A class "], [2]), 20)[0]
    assert rest[2] == run(model, model.start(["def "], [3]), 20)[0]


def test_removed_rows_leave_the_others_unchanged(model):
    state = model.start(PROMPTS, seeds=[10, 11, 12, 13, 14])
    head = run(model, state, 5)
    model.remove(state, {1, 3})
    assert len(state) == 3
    rest = run(model, state, 15)
    for row, original in enumerate([0, 2, 4]):
        alone = run(model, model.start([PROMPTS[original]], [10 + original]), 20)[0]
        assert head[original] + rest[row] == alone
    model.remove(state, [0, 1, 2])
    assert model.step(state) == []


def test_unknown_characters_and_long_prompts_are_accepted(model):
    state = model.start(["\x00\U0001f600" * 50], seeds=[5])
    assert len(run(model, state, 5)[0]) == 5


def test_a_seed_out_of_range_fails_its_request_alone():
    """A negative seed once failed every stream of its batch (numpy's uint64 overflow)."""
    import worker as example  # the example's worker, from this directory as model.py

    from corral.testing import FakeProxy

    with FakeProxy(example.Generate()) as proxy:
        bad, good = proxy.stream(
            [
                {"prompt": "A ", "max_tokens": 3, "seed": -1},
                {"prompt": "A ", "max_tokens": 3, "seed": 1},
            ]
        )
    assert bad.status == "invalid", bad
    assert good.status == "end" and len("".join(good.chunks)) == 3, good
