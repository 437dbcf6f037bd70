"""`gptkit serve` under a steady load for minutes: does its memory stay put?

A server of a tiny language model and a tiny classifier on 127.0.0.1 gets a bounded rate of
requests (completions streamed and not, classifications, embeddings, the model list and health)
for ``--seconds`` (10 minutes by default), from a few client threads. The server's resident memory
(``VmRSS``) is read every 2 seconds; after a warm-up (the first minute), its highest value and its
last are compared with its value at the warm-up's end. Prints one JSON line and keeps it as
results/serve_soak.json (``make fuzz`` runs it); ``--render`` writes it into docs/operations.md.

    python benchmarks/serve_soak.py                   # 10 minutes, 8 requests a second
    python benchmarks/serve_soak.py --seconds 120     # a short run
    python benchmarks/serve_soak.py --render          # results/serve_soak.json into operations.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import textwrap
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import machine

from gptkit.io import write_json
from gptkit.testing.processes import ServerProcess, free_port
from gptkit.testing.serve_schema import CLASSIFIER, LM, build_models, serve_args

REPO = Path(__file__).resolve().parents[1]

GROWTH_LIMIT = 0.05  # of the resident memory at the warm-up's end
RESULT = REPO / "results" / "serve_soak.json"
DOC = REPO / "docs" / "operations.md"
BEGIN = "<!-- begin: rendered from results/serve_soak.json by benchmarks/serve_soak.py --render -->"
END = "<!-- end: soak -->"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def requests_cycle() -> list[tuple[str, str, dict | None]]:
    """The mix each client cycles through: (method, path, JSON body)."""
    return [
        ("POST", "/v1/completions", {"model": LM, "prompt": "the plot holds", "max_tokens": 16}),
        ("POST", "/v1/completions", {"model": LM, "prompt": "a gem", "max_tokens": 16, "stream": True}),
        ("POST", "/v1/classify", {"model": CLASSIFIER, "input": ["a gem of a film", "dull and long"]}),
        ("POST", "/v1/embeddings", {"model": LM, "input": ["the cast shines"]}),
        ("POST", "/v1/completions", {"model": LM, "prompt": "dull", "max_tokens": 8, "temperature": 0.8}),
        ("GET", "/v1/models", None),
        ("GET", "/health", None),
    ]


def soak(seconds: float, warmup: float, rate: float, clients: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="gptkit-soak-") as root:
        models = build_models(Path(root))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = ServerProcess(serve_args(models, port, None), Path(root) / "server.log")
        try:
            server.wait_ready(base)
            return _drive(server.process.pid, base, seconds, warmup, rate, clients)
        finally:
            server.kill()


def _drive(pid: int, base: str, seconds: float, warmup: float, rate: float, clients: int) -> dict:
    statuses: Counter[str] = Counter()
    lock, stop = threading.Lock(), threading.Event()
    cycle = requests_cycle()
    samples: list[tuple[float, float]] = []
    start = time.monotonic()

    def client(index: int) -> None:
        # Each client keeps its share of the rate, the requests of the cycle in turn.
        interval, n = clients / rate, index
        with httpx.Client(base_url=base, timeout=30) as http:
            next_at = start + index * interval / clients
            while not stop.is_set():
                method, path, body = cycle[n % len(cycle)]
                n += 1
                try:
                    with http.stream(method, path, json=body) as response:
                        for _ in response.iter_bytes():
                            pass
                    status = str(response.status_code)
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with lock:
                    statuses[status] += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    with ThreadPoolExecutor(clients) as pool:
        for index in range(clients):
            pool.submit(client, index)
        while time.monotonic() - start < seconds:
            samples.append((time.monotonic() - start, rss_mb(pid)))
            time.sleep(2.0)
        stop.set()
    after_warmup = [rss for t, rss in samples if t >= warmup]
    baseline = after_warmup[0]
    highest, last = max(after_warmup), after_warmup[-1]
    requests = sum(statuses.values())
    return {
        "seconds": round(time.monotonic() - start, 1),
        "warmup_s": warmup,
        "rate_per_s": rate,
        "clients": clients,
        "requests": requests,
        "statuses": dict(statuses),
        "server_errors": sum(v for k, v in statuses.items() if not k.isdigit() or k.startswith("5")),
        "rss_mb": {
            "start": round(samples[0][1], 1),
            "after_warmup": round(baseline, 1),
            "highest": round(highest, 1),
            "last": round(last, 1),
        },
        "growth": {"highest": round(highest / baseline - 1, 4), "last": round(last / baseline - 1, 4)},
        "within_limit": highest / baseline - 1 <= GROWTH_LIMIT,
        "growth_limit": GROWTH_LIMIT,
        # Every 30 seconds' reading: the curve, without the file growing with the run.
        "rss_every_30_s": [round(rss, 1) for t, rss in samples[::15]],
    }


def render(record: dict) -> str:
    """The paragraph docs/operations.md shows, between its markers."""
    rss, growth = record["rss_mb"], record["growth"]
    statuses = ", ".join(f"{count:,} × {status}" for status, count in sorted(record["statuses"].items()))
    text = (
        f"{record['date']}; {record['machine']}. {record['seconds'] / 60:.0f} minutes at "
        f"{record['rate_per_s']:g} requests a second from {record['clients']} clients: "
        f"{record['requests']:,} requests ({statuses}), {record['server_errors']} server errors. "
        f"Resident memory {rss['after_warmup']:,.1f} MB after the {record['warmup_s']:.0f}-second warm-up, "
        f"at most {rss['highest']:,.1f} MB after it ({growth['highest']:+.1%}), {rss['last']:,.1f} MB at "
        f"the end ({growth['last']:+.1%}): {'within' if record['within_limit'] else 'past'} "
        f"{record['growth_limit']:.0%} of it."
    )
    return "\n".join([BEGIN, "", *textwrap.wrap(text, 100, break_on_hyphens=False), "", END])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="how long (default 600)")
    parser.add_argument("--warmup", type=float, default=60, help="warm-up, not judged (default 60)")
    parser.add_argument("--rate", type=float, default=8, help="requests a second, in all (default 8)")
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--render", action="store_true", help="only render the kept run into operations.md")
    args = parser.parse_args()
    if args.render:
        document = DOC.read_text(encoding="utf-8")
        if BEGIN not in document or END not in document:
            raise SystemExit(f"{DOC}: the markers are missing; put {BEGIN!r} and {END!r} where it goes")
        head, rest = document.split(BEGIN, 1)
        table = render(json.loads(RESULT.read_text(encoding="utf-8")))
        DOC.write_text(head + table + rest.split(END, 1)[1], encoding="utf-8")
        return 0
    if args.seconds <= args.warmup:
        parser.error("--seconds must be longer than --warmup")
    result = soak(args.seconds, args.warmup, args.rate, args.clients)
    record = {"benchmark": "serve_soak", "date": datetime.date.today().isoformat(), "machine": machine()}
    record |= {"comparisons": [], **result}
    print(json.dumps(record))
    write_json(RESULT, record)  # through a temporary file, as every record
    return 0 if result["within_limit"] and not result["server_errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
