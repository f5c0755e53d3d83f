"""Stream a generated text to the terminal as it is produced (standard library only).

    python examples/generate/client.py "The " 200 [URL]

URL defaults to Corral's http://localhost:8000/infer. Each SSE event's data is one chunk (a
character as JSON); `event: done` ends the stream and `event: error` carries what went wrong.
"""

import json
import sys
import urllib.error
import urllib.request


def stream(url: str, prompt: str, max_tokens: int):
    """Yield the chunks of one stream as they arrive."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode(),
        headers={"content-type": "application/json", "accept": "text/event-stream"},
    )
    try:
        response = urllib.request.urlopen(request)
    except urllib.error.HTTPError as refused:  # refused before streaming: Corral's JSON error
        text = refused.read().decode(errors="replace")
        try:
            body = json.loads(text)
            reason = f"{body['error']}: {body['message']}"
        except (ValueError, TypeError, KeyError):  # not Corral's (a proxy in front of it, say)
            reason = text.strip()[:200] or refused.reason
        raise RuntimeError(f"{refused.code} {reason}") from None
    except urllib.error.URLError as unreached:
        raise RuntimeError(f"cannot reach {url}: {unreached.reason}") from None
    with response:
        event = "message"
        for raw in response:  # one line at a time, as the server sends them
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                if event == "error":
                    raise RuntimeError(f"{data['error']}: {data['message']}")
                if event == "done":
                    return
                yield data
            elif not line:
                event = "message"  # a blank line ends an event
    # Every stream ends with `done` or `error`: one that stops without is cut off.
    raise RuntimeError("the stream was cut off before it ended")


if __name__ == "__main__":
    prompt = sys.argv[1] if len(sys.argv) > 1 else "The "
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    url = sys.argv[3] if len(sys.argv) > 3 else "http://localhost:8000/infer"
    print(prompt, end="", flush=True)
    try:
        for chunk in stream(url, prompt, tokens):
            print(chunk, end="", flush=True)
    except RuntimeError as failed:
        sys.exit(f"\n{failed}")
    print()
