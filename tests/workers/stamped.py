"""A typed worker whose request and response hold bytes and a timezone-aware datetime, the values
whose JSON form (base64 and RFC 3339 strings, as its JSON Schema says) msgpack writes otherwise:
it answers each upload with its bytes reversed, their count, and its time in UTC."""

import datetime

import msgspec

import corral


class Upload(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    data: bytes
    at: datetime.datetime


class Receipt(msgspec.Struct):
    name: str
    reversed: bytes
    size: int
    at: datetime.datetime


class Stamped(corral.Worker):
    input_type = Upload
    output_type = Receipt
    examples = ({"name": "warm", "data": b"\x00\x01", "at": "2024-05-06T07:08:09+02:00"},)

    def forward(self, batch):
        return [
            Receipt(u.name, u.data[::-1], len(u.data), u.at.astimezone(datetime.timezone.utc))
            for u in batch
        ]


if __name__ == "__main__":
    Stamped.run()
