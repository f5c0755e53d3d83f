"""Exceptions a worker author raises or may see, and how a failure is told to a client."""


class ValidationError(Exception):
    """Raise in ``preprocess`` to reject one item: the client gets 422 with this message, and the
    item's batch-mates are processed as usual."""


class ProtocolError(Exception):
    """The peer sent something the worker protocol does not allow; the connection is dropped."""


class ConnectionEnded(Exception):
    """The proxy closed the connection (cleanly, between frames): serving ends. Here, not in
    ``_serve``, so that a streaming run seeing it between steps passes it on rather than take it
    for its ``forward``'s failure (``_streaming``)."""


STOPS = (KeyboardInterrupt, SystemExit)
"""What a hook may raise and still stop the worker; anything else fails the items it touched
(a GeneratorExit or a library's own BaseException included) and the worker goes on."""


def text(error: BaseException) -> str:
    """An exception's message, even when its ``__str__`` is broken."""
    try:
        return str(error)
    # A broken __str__ must not cost more than its own message, whatever it raises: one raising
    # a BaseException (GeneratorExit, say) had ended the worker from any hook.
    except BaseException:
        return "(the exception's message could not be read)"


# An error result's message goes to every client of the batch, and into the proxy's log: an
# exception quoting a whole input (or a megabyte of it) is cut here; the worker's own log keeps
# it whole.
MESSAGE_LIMIT = 2000


def describe(error: BaseException) -> str:
    """:func:`named`, as an error result's message: cut past :data:`MESSAGE_LIMIT` characters,
    saying how long it was."""
    return cut(named(error))


def named(error: BaseException) -> str:
    """``Type: message``, whole; ``Type`` alone for an exception with no message
    (``MemoryError()``: its clients were told ``"MemoryError: "``)."""
    said = text(error)
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


def amount(count: int, one: str, many: str) -> str:
    """``count`` of a thing in words: "1 input", "2 inputs" (a message read "for 1 inputs")."""
    return f"{count} {one if count == 1 else many}"


def cut(message: str) -> str:
    """``message``, cut past :data:`MESSAGE_LIMIT` characters, saying how long it was: for a
    result's message. A ``ValidationError`` quoting megabytes had been sent whole, and a batch of
    such 422s, over one frame's size, answered some of its clients 500 for an output too
    large."""
    if len(message) <= MESSAGE_LIMIT:
        return message
    return f"{message[:MESSAGE_LIMIT]}… (cut: {len(message):,} characters in all)"
