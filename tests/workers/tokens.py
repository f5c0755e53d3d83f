"""A streaming worker on the Python package (generator `forward`): item `{"n": k}` streams
`"<tag>-0"` … `"<tag>-(k-1)"`, one per step for the whole running batch. `"gate": path` holds an
item after its first token until that file exists (the others go on). Positions the proxy
cancelled are appended to TOKENS_CANCELS as the items' tags. TOKENS_MAX_RUNNING turns joining on;
with TOKENS_PEAKS set, each generator appends there the most items it had running at once.
"""

import os
import threading

import corral


class Tokens(corral.Worker):
    max_running = int(os.environ.get("TOKENS_MAX_RUNNING", "0")) or None

    def forward(self, batch):
        items, sent, seen = list(batch), [0] * len(batch), set()
        wake = threading.Event()
        peak = 0  # the most items running at once (not ended before this step)
        while any(sent[p] <= item["n"] for p, item in enumerate(items)):
            peak = max(peak, sum(1 for p, item in enumerate(items) if sent[p] <= item["n"]))
            for p in self.cancelled - seen:
                seen.add(p)
                with open(os.environ["TOKENS_CANCELS"], "a") as f:
                    f.write(items[p].get("tag", "t") + "\n")
            step = [None] * len(items)
            for p, item in enumerate(items):
                gate = item.get("gate")
                if p in self.cancelled or sent[p] > item["n"]:
                    sent[p] = item["n"] + 1
                elif sent[p] == 1 and gate and not os.path.exists(gate):
                    continue
                elif sent[p] == item["n"]:
                    step[p], sent[p] = corral.END, sent[p] + 1
                else:
                    step[p], sent[p] = f"{item.get('tag', 't')}-{sent[p]}", sent[p] + 1
            if all(s is None for s in step):
                wake.wait(0.01)  # only gated items: look at the gates (and cancels) again
            joined = yield step
            items += joined
            sent += [0] * len(joined)
        if os.environ.get("TOKENS_PEAKS"):
            with open(os.environ["TOKENS_PEAKS"], "a") as f:
                f.write(f"{peak}\n")


if __name__ == "__main__":
    Tokens.run()
