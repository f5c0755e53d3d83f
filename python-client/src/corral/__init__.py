"""Write inference workers for the Corral batching proxy.

Subclass :class:`Worker`, implement :meth:`Worker.forward` (a batch in, one output per input out),
and call ``YourWorker.run()``: the package connects to the proxy's Unix socket, says hello, and
then pulls batches whenever it is idle. Optional per-item hooks ``preprocess`` and ``postprocess``
run around ``forward``; raising :class:`ValidationError` in ``preprocess`` rejects that item alone
(the client gets 422) while its batch-mates go on. A ``forward`` written as a generator streams:
each ``yield`` gives a chunk (or None, or :data:`END`) per item, and with ``max_running`` set new
items join the running generator between steps. Declaring ``inputs`` and ``outputs`` as
:class:`Tensor` tuples serves Open Inference Protocol v2 clients (rows of tensors, as numpy arrays
when numpy is installed).

Modules: ``_worker`` (the Worker base class: hooks, a plain batch's ``forward``, starting),
``_declarations`` (what a Worker subclass declares, checked where the class is defined),
``_streaming`` (running a generator ``forward``: chunks, END, cancellation, joining), ``_batch``
(the per-job steps around ``forward`` both share: each job decoded and preprocessed, each output
or chunk postprocessed and encoded, a failure answered alone), ``_serve`` (one proxy
connection with its reader thread, and the connect loop), ``_process_end`` (a spawned worker's
process ended for certain), ``_typing`` (payload decoding, output
encoding, schemas), ``_tensors`` (the :class:`Tensor` declaration and tensor values, decoded to
numpy arrays or lists and encoded from them), ``_protocol`` (frames and messages, as documented
in the repository's worker-protocol/PROTOCOL.md), ``_json_form`` (a typed worker's values in
the JSON form its schemas describe), ``_shared_memory`` (payloads read from the proxy's shared
memory), ``_allocator`` (glibc's malloc set for large items), ``_tracing`` (optional OpenTelemetry
spans), ``_failures`` (the worker's own failures, logged without flooding), ``_logging`` (the
worker's log where the application set none), ``_errors``, ``testing`` (a fake proxy for
unit-testing a worker without the Corral binary, and tensor values for its payloads).
"""

from corral._errors import ProtocolError, ValidationError
from corral._protocol import MAX_FRAME_BYTES, PROTOCOL_VERSION
from corral._streaming import END
from corral._tensors import Tensor
from corral._worker import Worker

__all__ = [
    "END",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Tensor",
    "ValidationError",
    "Worker",
]
__version__ = "0.1.0"
