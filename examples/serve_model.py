"""Serve the model examples/train_checkpoint.ipynb trained, as a model endpoint (docs/endpoints.md).

    gpupool submit examples/train_checkpoint.ipynb -p steps=30     # trains; writes model.json
    gpupool serve serve_model.py --model model.json                 # serves it behind a hub URL

The notebook's model is a logistic regression that tells two clouds of 2-D points apart, trained
on data the notebook makes itself: nothing is downloaded. ``GET /`` says which model it serves,
from which job, its step and validation accuracy (the readiness probe asks it too); ``POST
/predict`` with ``{"x": [[x1, x2], ...]}`` answers the probability of class 1 and the class of each
point. ``--model`` also takes a job's checkpoints directory, to serve its newest checkpoint (a run
that was stopped before its end). Standard library only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def load(path: Path) -> dict:
    """The model: ``model.json`` as the notebook wrote it, or the newest checkpoint of a job's
    checkpoints directory (the one gpupool.checkpoint's ``LATEST`` names)."""
    if path.is_dir():
        from gpupool.protocol import read_latest

        latest = read_latest(str(path))
        if latest is None:
            raise SystemExit(f"no checkpoint in {path}")
        with open(latest, "rb") as f:
            return {**pickle.load(f), "file": Path(latest).name}
    return {**json.loads(path.read_text()), "file": path.name}


def probability(model: dict, point: list) -> float:
    """The probability of class 1 for one point ``[x1, x2]``."""
    if len(point) != len(model["w"]):
        raise ValueError(f"each x is a point of {len(model['w'])} numbers, not {point!r}")
    z = sum(float(wi) * float(xi) for wi, xi in zip(model["w"], point)) + float(model["b"])
    return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def make_handler(model: dict) -> type:
    class Model(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {k: model.get(k) for k in ("file", "job", "step", "loss", "val_acc")})

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/predict":
                return self._send(404, {"error": 'POST /predict with {"x": [[x1, x2], ...]}'})
            try:
                xs = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["x"]
                p = [probability(model, point) for point in xs]
                self._send(200, {"p": p, "label": [int(q > 0.5) for q in p], "model": model["file"]})
            except (ValueError, KeyError, TypeError) as e:
                self._send(400, {"error": f"bad request: {e}"})

        def log_message(self, fmt: str, *args: object) -> None:
            print(f"{self.headers.get('X-Gpupool-User', '-')}: {fmt % args}", flush=True)

    return Model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "--checkpoints", dest="model", default="model.json",
                    help="the model.json the notebook wrote (default), or a job's checkpoints directory")
    args = ap.parse_args(argv)
    path = Path(args.model).expanduser()
    model = load(path)
    port = int(os.environ.get("PORT", "8000"))
    print(f"serving {path} (step {model.get('step')}, val_acc {model.get('val_acc')}) on port {port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), make_handler(model)).serve_forever()


if __name__ == "__main__":
    main()
