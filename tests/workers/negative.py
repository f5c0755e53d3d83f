"""A worker for raw bodies (tests/test_raw_bodies.py): it takes PNG images as raw bytes and
answers each with its negative, as a PNG.

- An item sent as `image/png` (parameters allowed) must be an 8-bit grayscale PNG whose rows are
  unfiltered (what the tests write); anything else is a 422. The answer is the same image with
  every pixel inverted, as PNG bytes with `output_content_type` `image/png`, carrying two
  `tEXt` chunks: `content-type`, the media type the worker saw for the item, and `batch`, the
  JSON list of the media types of its batch (null for a JSON item).
- An item of any other media type is a 422 naming the type it saw.
- A JSON or msgpack item is echoed as `{"echo": item, "content_types": [...]}` (its batch's
  media types), so that a test can see a JSON client and a raw one share a batch.

NEGATIVE_OUTPUT_TYPE overrides `output_content_type` (e.g. with one that is no media type: set
in the package's codec, past the checks where the package would refuse it).
The PNG code is the standard library's zlib and struct only.
"""

import json
import os
import struct
import zlib

import corral
from corral import _typing

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of an 8-bit grayscale, unfiltered, non-interlaced PNG."""
    if not data.startswith(SIGNATURE):
        raise corral.ValidationError("not a PNG: no PNG signature")
    at, header, pixels = len(SIGNATURE), None, b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise corral.ValidationError(f"PNG chunk {kind!r} has a bad CRC")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            pixels += body
        at += 12 + length
    if header is None or header[2:] != (8, 0, 0, 0, 0):
        raise corral.ValidationError("only 8-bit grayscale, non-interlaced PNGs are taken")
    width, height = header[:2]
    raw = zlib.decompress(pixels)
    rows = [raw[r * (width + 1) : (r + 1) * (width + 1)] for r in range(height)]
    if any(len(row) != width + 1 or row[0] != 0 for row in rows):
        raise corral.ValidationError("only unfiltered rows are taken")
    return width, height, [row[1:] for row in rows]


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def write_png(width: int, height: int, rows: list[bytes], text: dict[str, str]) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\x00" + row for row in rows))
    notes = [chunk(b"tEXt", key.encode() + b"\x00" + value.encode()) for key, value in text.items()]
    return b"".join(
        [SIGNATURE, chunk(b"IHDR", header), *notes, chunk(b"IDAT", pixels), chunk(b"IEND", b"")]
    )


class Negative(corral.Worker):
    output_content_type = "image/png"

    def preprocess(self, item):
        if self.content_type is None:  # a JSON or msgpack request
            return item
        essence = self.content_type.split(";")[0].strip().lower()
        if essence != "image/png":
            raise corral.ValidationError(f"expected image/png, got {self.content_type!r}")
        assert isinstance(item, bytes), type(item)
        return read_png(item)

    def forward(self, batch):
        seen = json.dumps(self.content_types)
        outputs = []
        for item, content_type in zip(batch, self.content_types):
            if content_type is None:
                outputs.append({"echo": item, "content_types": self.content_types})
                continue
            width, height, rows = item
            negative = [bytes(255 - pixel for pixel in row) for row in rows]
            text = {"content-type": content_type, "batch": seen}
            outputs.append(write_png(width, height, negative, text))
        return outputs


# Set past the package's own checks (at the class statement, and when the class's codec is
# built): a name that is no media type is the proxy's to refuse (500 bad_output), which is what
# the tests using it are about.
_typing.codec(Negative).output_content_type = os.environ.get("NEGATIVE_OUTPUT_TYPE", "image/png")


if __name__ == "__main__":
    Negative.run()
