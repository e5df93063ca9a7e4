"""Serve the newest checkpoint of a training job as a model endpoint (docs/endpoints.md).

    gpupool submit examples/train_checkpoint.ipynb -p steps=20      # j-000041 saves checkpoints
    gpupool serve serve_model.py --checkpoints ~/.../j-000041/checkpoints

``GET /`` says which checkpoint it serves (the readiness probe asks it too); ``POST /predict``
with ``{"x": [...]}`` answers the checkpoint's prediction for each x: the notebook's model is a
decaying loss, ``loss * 0.9 ** x`` (x steps further). Standard library only; no download.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def newest(checkpoints: Path) -> Path:
    """The newest checkpoint (the one gpupool.checkpoint's ``LATEST`` names)."""
    from gpupool.protocol import read_latest

    latest = read_latest(str(checkpoints))
    if latest is None:
        raise SystemExit(f"no checkpoint in {checkpoints}")
    return Path(latest)


def make_handler(path: Path, state: dict) -> type:
    class Model(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {"model": path.name, "step": state.get("step"), "loss": state.get("loss")})

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/predict":
                return self._send(404, {"error": "POST /predict with {\"x\": [steps, ...]}"})
            try:
                xs = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["x"]
                self._send(200, {"y": [state["loss"] * 0.9 ** float(x) for x in xs], "model": path.name})
            except (ValueError, KeyError, TypeError) as e:
                self._send(400, {"error": f"bad request: {e}"})

        def log_message(self, fmt: str, *args: object) -> None:
            print(f"{self.headers.get('X-Gpupool-User', '-')}: {fmt % args}", flush=True)

    return Model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", required=True, help="a job's checkpoints directory")
    args = ap.parse_args(argv)
    path = newest(Path(args.checkpoints).expanduser())
    with open(path, "rb") as f:
        state = pickle.load(f)
    port = int(os.environ.get("PORT", "8000"))
    print(f"serving {path} on port {port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), make_handler(path, state)).serve_forever()


if __name__ == "__main__":
    main()
