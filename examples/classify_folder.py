"""Classify a folder of photos through a running `gpufeed serve`, with nothing but the standard library.

    gpufeed serve --model models/flowers      # prints: listening on http://127.0.0.1:8000 ...
    python examples/classify_folder.py photos/ --url http://127.0.0.1:8000

Each JPEG or PNG is posted as it is to ``/v1/models/<name>/predict``; the server decodes, resizes
and batches it with other requests, and answers the top classes with their scores. A photo it
refuses (damaged, a pixel bomb) is one line with its reason; the rest go on (exit status 1).
"""

import argparse
import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path

TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}


def call(url: str, body: bytes | None = None, content_type: str = "") -> dict:
    request = urllib.request.Request(url, data=body, headers={"content-type": content_type} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as err:  # gpufeed answers refusals as JSON {"error", "reason"}
        text = err.read().decode(errors="replace")
        if not 400 <= err.code < 500:  # the server's fault, not this photo's: stop
            raise SystemExit(f"{url}: HTTP {err.code}: {text}") from None
        with contextlib.suppress(ValueError, AttributeError):
            text = json.loads(text).get("reason", text)
        return {"refused": f"HTTP {err.code}: {text}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="folder of .jpg/.png photos (searched recursively)")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's address")
    parser.add_argument("--model", help="model name (default: the first the server lists)")
    parser.add_argument("--top-k", type=int, default=1)
    args = parser.parse_args()
    model = args.model or call(f"{args.url}/v1/models")["models"][0]["name"]
    photos = sorted(p for p in args.folder.rglob("*") if p.suffix.lower() in TYPES)
    if not photos:
        raise SystemExit(f"no .jpg or .png files in {args.folder}")
    counts: dict[str, int] = {}
    for photo in photos:
        url = f"{args.url}/v1/models/{model}/predict?top_k={args.top_k}"
        answer = call(url, photo.read_bytes(), TYPES[photo.suffix.lower()])
        if "refused" in answer:  # a damaged photo is no reason to leave the others unclassified
            print(f"{photo.relative_to(args.folder)}: refused: {answer['refused']}")
            continue
        top = answer["predictions"][0]["top_k"]
        counts[top[0]["label"]] = counts.get(top[0]["label"], 0) + 1
        print(f"{photo.relative_to(args.folder)}: " + ", ".join(f"{t['label']} {t['score']:.2f}" for t in top))
    refused = len(photos) - sum(counts.values())
    print(f"classified {len(photos) - refused} photos with {model}: {json.dumps(counts)}; {refused} refused")
    raise SystemExit(1 if refused else 0)


if __name__ == "__main__":
    main()
