"""`bert-kit serve`: a model folder behind a JSON HTTP API, with dynamic batching.

    pip install "bert-kit[serve]"
    bert-kit serve --model runs/finetune_sst2/best --port 8080
    curl -s localhost:8080/classify -d '{"inputs": ["a gripping, funny film", ["a question", "a pair"]]}'

The folder's recorded task decides the endpoints (/classify, /tag, /answer, /similarity; /embed
for every folder, /fill-mask with an MLM head); see `operations`. Concurrent requests share
model batches (`batcher`): inputs queue up and run together, bounded by tokens and by a short
wait, so under load one forward pass serves many clients. `app` is the Starlette app (limits,
errors, /health, /metrics, /openapi.json), `jsonio` its JSON (orjson where installed), `metrics`
the Prometheus counters, `server` runs it under uvicorn in one process and shuts down on SIGTERM
without dropping an accepted request, and `workers` runs several such processes on one port
(`serve`: `--workers`, by default several on a GPU).

Starlette and uvicorn are an optional extra (with orjson, httptools and uvloop, used where
installed); the rest of bert-kit does not need them.
"""

from bert_kit.serving.server import ServeConfig
from bert_kit.serving.workers import serve

__all__ = ["ServeConfig", "serve"]
