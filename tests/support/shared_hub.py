"""The shared client hub of tests/conftest.py (its session ``hub`` fixture): the cluster and queues,
the example notebooks in alice's and bob's homes, and the dummy authenticator's password (the
`gpupool login` and browser tests log in with it)."""
from hub_harness import notebook

SETTINGS = {
    "nodes": [{"name": "box", "gpus": 2, "gpu_memory": "24Gi"}, {"name": "box2", "gpus": 1, "gpu_memory": "24Gi"}],
    "queues": [{"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"]},
               {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]}],
}
NOTEBOOKS = {
    # logs acc = lr * step for steps 0..steps-1
    "tiny.ipynb": notebook("import gpupool\nfor i in range(steps):\n    gpupool.log_metric('acc', lr * i, step=i)\n"
                           "print('trained with lr', lr)", parameters="lr = 0.1\nsteps = 3"),
    "sleepy.ipynb": notebook("import time\ntime.sleep(seconds)", parameters="seconds = 300"),
    "broken.ipynb": notebook("raise ValueError('the data set is missing')"),
    # sweep objective: score peaks at x == 3; trials with x < slow_below sleep between steps
    "quad.ipynb": notebook("import time, gpupool\nfor i in range(steps):\n"
                           "    gpupool.log_metric('score', (10 - (x - 3) ** 2) * (i + 1) / steps, step=i)\n"
                           "    time.sleep(pause if x < slow_below else 0)",
                           parameters="x = 0.0\nsteps = 3\npause = 0.0\nslow_below = -1e9"),
}
PASSWORD = "s3cret"  # the dummy authenticator's one password (`gpupool login` tests)
