"""A typed worker taking text and bytes in list fields, as a v2 client sends both (`BYTES`): it
answers each row with its text upper-cased and the length of each of its bytes."""

import msgspec

import corral


class Texts(msgspec.Struct):
    text: list[str]
    raw: list[bytes] = []


class Shouting(corral.Worker):
    input_type = Texts

    def forward(self, batch):
        return [{"upper": [t.upper() for t in row.text], "sizes": [len(b) for b in row.raw]}
                for row in batch]  # fmt: skip


if __name__ == "__main__":
    Shouting.run()
