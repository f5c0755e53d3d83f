"""Exceptions a worker author raises or may see."""


class ValidationError(Exception):
    """Raise in ``preprocess`` to reject one item: the client gets 422 with this message, and the
    item's batch-mates are processed as usual."""


class ProtocolError(Exception):
    """The peer sent something the worker protocol does not allow; the connection is dropped."""
