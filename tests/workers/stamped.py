"""A typed worker whose request and response hold bytes and a timezone-aware datetime, the values
whose JSON form (base64 and RFC 3339 strings, as its JSON Schema says) msgpack writes otherwise:
it answers each upload with its bytes reversed, their count, and its time in UTC. With
STAMPED_OUTPUT=dict its `output_type` is `dict` and it answers the receipt as one (a schema that
promises no form: the values go out in their JSON form all the same); with STAMPED_OUTPUT=none it
declares no `output_type`, and msgspec writes the receipt as msgpack has it (a `bin`, a
timestamp)."""

import datetime
import os

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
    if os.environ.get("STAMPED_OUTPUT") != "none":
        output_type = dict if os.environ.get("STAMPED_OUTPUT") == "dict" else Receipt
    examples = ({"name": "warm", "data": b"\x00\x01", "at": "2024-05-06T07:08:09+02:00"},)

    def forward(self, batch):
        receipts = [
            Receipt(u.name, u.data[::-1], len(u.data), u.at.astimezone(datetime.timezone.utc))
            for u in batch
        ]
        if self.output_type is dict:
            return [msgspec.structs.asdict(receipt) for receipt in receipts]
        return receipts


if __name__ == "__main__":
    Stamped.run()
