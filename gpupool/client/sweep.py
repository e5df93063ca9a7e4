"""Hyperparameter sweeps: every trial is a papermill job in the pool, optuna picks the parameters.

``gpupool.sweep("train.ipynb", space={...}, objective="val_acc", ...)`` creates (or reattaches to)
an optuna study in an RDB storage (default: the sqlite file ``.gpupool-sweeps.db`` in the current
directory; study name = sweep name). A driver thread asks optuna for parameters, submits each trial
as a job (kind ``hpo-trial``, ``sweep`` = the sweep name, parameters injected by papermill), reads
the metrics the trial notebooks log with ``gpupool.log_metric``, reports them step by step to the
optuna pruner (cancelling pruned jobs) and tells optuna the objective's last value when a job
succeeds. Each trial's job id is stored as the trial user attr ``job_id``, so running
``gpupool.sweep(..., name=...)`` again after a kernel restart reattaches to the running jobs instead
of submitting them again.
"""
from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .api import Client, ConnectionFailed, GPUPoolError, NotFound, get_client
from ..contract import CANCELLED, ENDED, HPO_TRIAL, SUCCEEDED
from .jobs import Job, build_body, metrics_of

DEFAULT_STORAGE_FILE = ".gpupool-sweeps.db"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_FAILURE_GUARD = 3  # stop when the first this-many finished trials all failed (a broken notebook)


class SweepError(GPUPoolError):
    """The sweep could not run (bad space, broken trial notebook, submission refused...)."""


# -- search-space helpers ------------------------------------------------------------------------
def loguniform(low: float, high: float):
    """A float sampled log-uniformly in [low, high] (e.g. learning rates)."""
    import optuna
    if not (0 < low < high):
        raise ValueError(f"loguniform({low}, {high}): need 0 < low < high")
    return optuna.distributions.FloatDistribution(float(low), float(high), log=True)


def uniform(low: float, high: float, step: float | None = None):
    """A float sampled uniformly in [low, high] (on a grid of ``step`` when given)."""
    import optuna
    if not low < high:
        raise ValueError(f"uniform({low}, {high}): need low < high")
    return optuna.distributions.FloatDistribution(float(low), float(high), step=step)


def intuniform(low: int, high: int, step: int = 1, log: bool = False):
    """An integer in [low, high] (inclusive)."""
    import optuna
    if int(low) != low or int(high) != high or not low < high:
        raise ValueError(f"intuniform({low}, {high}): need integers low < high")
    return optuna.distributions.IntDistribution(int(low), int(high), step=int(step), log=log)


def choice(*values):
    """One of the given values: ``choice(2, 4, 8)`` or ``choice([2, 4, 8])``."""
    import optuna
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = tuple(values[0])
    if not values:
        raise ValueError("choice(): give at least one value")
    for v in values:
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ValueError(f"choice(): {v!r} is not a number, string, bool or None")
    return optuna.distributions.CategoricalDistribution(tuple(values))


def to_distributions(space: Mapping[str, Any]) -> tuple[dict, dict]:
    """(optuna distributions, constant parameters) from a user's space dict."""
    import optuna
    if not isinstance(space, Mapping) or not space:
        raise SweepError("space: give a dict such as {'lr': gpupool.loguniform(1e-5, 1e-1), 'layers': [2, 4, 8]}",
                         field="space")
    dists, fixed = {}, {}
    for name, spec in space.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SweepError(f"space: {name!r} is not a valid parameter name", field="space")
        if isinstance(spec, optuna.distributions.BaseDistribution):
            dists[name] = spec
        elif isinstance(spec, (list, tuple)):
            try:
                dists[name] = choice(*spec) if spec else choice()
            except ValueError as e:
                raise SweepError(f"space: {name}: {e}", field="space") from None
        elif spec is None or isinstance(spec, (bool, int, float, str)):
            fixed[name] = spec
        else:
            raise SweepError(f"space: {name}: use loguniform/uniform/intuniform/choice or a list, "
                             f"not {type(spec).__name__}", field="space")
    if not dists:
        raise SweepError("space: nothing to search (every entry is a constant)", field="space")
    return dists, fixed


def grid_of(dists: Mapping[str, Any]) -> dict[str, list]:
    import optuna
    grid = {}
    for name, d in dists.items():
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            grid[name] = list(d.choices)
        elif isinstance(d, optuna.distributions.IntDistribution) and not d.log:
            grid[name] = list(range(d.low, d.high + 1, d.step))
        elif isinstance(d, optuna.distributions.FloatDistribution) and d.step is not None:
            n = int(round((d.high - d.low) / d.step))
            grid[name] = [d.low + i * d.step for i in range(n + 1)]
        else:
            raise SweepError(f"sampler='grid' needs discrete parameters: {name!r} is continuous; "
                             "use choice([...]), intuniform or uniform(low, high, step=...)", field="space")
    return grid


def make_sampler(sampler, dists, seed=None):
    import optuna
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    name = (sampler or "tpe").lower()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(grid_of(dists), seed=seed)
    raise SweepError(f"sampler: {sampler!r} is not one of tpe, random, grid (or an optuna sampler)", field="sampler")


def make_pruner(pruner):
    import optuna
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    if pruner is None or pruner is False or pruner == "none":
        return optuna.pruners.NopPruner()
    name = str(pruner).lower()
    if name == "median":
        return optuna.pruners.MedianPruner()
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if name in ("successive_halving", "asha", "sha"):
        return optuna.pruners.SuccessiveHalvingPruner()
    if name == "percentile":
        return optuna.pruners.PercentilePruner(25.0)
    raise SweepError(f"pruner: {pruner!r} is not one of median, hyperband, successive_halving, percentile, none "
                     "(or an optuna pruner)", field="pruner")


def _sqlite_file(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


def storage_url(storage: str | Path | None) -> str:
    if storage is None:
        return f"sqlite:///{(Path.cwd() / DEFAULT_STORAGE_FILE).resolve()}"
    s = str(storage)
    if "://" in s:
        return s
    return f"sqlite:///{Path(s).expanduser().resolve()}"


# -- results -------------------------------------------------------------------------------------
@dataclass
class BestTrial:
    number: int
    params: dict
    value: float
    job: Job | None

    def __repr__(self) -> str:
        job = self.job.id if self.job is not None else None
        return f"BestTrial(number={self.number}, value={self.value:g}, params={self.params}, job={job!r})"


@dataclass
class TrialTable:
    """A light table of trials (used when pandas is not installed): rows are dicts."""
    columns: list[str]
    rows: list[dict] = field(default_factory=list)

    def to_records(self) -> list[dict]:
        return [dict(r) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.to_records())

    def __getitem__(self, key):
        if isinstance(key, str):
            return [r.get(key) for r in self.rows]
        return self.rows[key]

    @staticmethod
    def _fmt(v) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    def __repr__(self) -> str:
        cells = [[self._fmt(r.get(c)) for c in self.columns] for r in self.rows]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(self.columns, widths)).rstrip()]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(self._fmt(r.get(c)))}</td>" for c in self.columns)
                       + "</tr>" for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# -- the sweep -----------------------------------------------------------------------------------
class Sweep:
    """A running (or finished) sweep; see :func:`sweep`."""

    def __init__(self, notebook, space, objective, *, direction="maximize", trials=20, parallel=4,
                 gpus=None, gpu_memory=None, queue=None, sampler="tpe", pruner="median", name=None,
                 storage=None, parameters=None, seed=None, poll=2.0, priority=None,
                 checkpoint_on_signal=None, client: Client | None = None, quiet=True, initial=None, pods=None):
        import optuna
        if quiet:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        if direction not in ("maximize", "minimize"):
            raise SweepError(f"direction: {direction!r} must be 'maximize' or 'minimize'", field="direction")
        if not isinstance(objective, str) or not objective:
            raise SweepError("objective: name the metric the trial notebook logs with gpupool.log_metric",
                             field="objective")
        if int(parallel) < 1:
            raise SweepError("parallel: must be >= 1", field="parallel")
        self.notebook = str(notebook)
        self.objective = objective
        self.direction = direction
        self.parallel = int(parallel)
        self.poll = float(poll)
        self.dists, fixed = to_distributions(space)
        self.parameters = {**dict(parameters or {}), **fixed}
        self._client = client
        if name is None:
            name = f"{Path(self.notebook).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        if not _NAME_RE.match(name):
            raise SweepError(f"name: {name!r} must be letters, digits, '.', '_' or '-' (at most 63)", field="name")
        self.name = name
        self._submit_kw = dict(gpus=gpus, gpu_memory=gpu_memory, queue=queue, priority=priority,
                               checkpoint_on_signal=checkpoint_on_signal, pods=pods)
        # Validate the job body once before touching storage (path / notebook problems surface now),
        # and reach the service: no hub, a refused token or a queue you may not use fails here, leaving no state.
        build_body(self.notebook, parameters=self.parameters, kind=HPO_TRIAL, sweep=name, **self._submit_kw)
        self._check_queue(queue)
        sampler_obj = make_sampler(sampler, self.dists, seed)
        if isinstance(sampler_obj, optuna.samplers.GridSampler):
            size = math.prod(len(v) for v in grid_of(self.dists).values())
            trials = size if trials is None else min(int(trials), size)
        self.trials_total = int(trials if trials is not None else 20)
        if self.trials_total < 1:
            raise SweepError("trials: must be >= 1", field="trials")
        self.storage = storage_url(storage)
        self._new_file = _sqlite_file(self.storage)  # removed again if this sweep never submits a trial
        if self._new_file is not None and self._new_file.exists():
            self._new_file = None
        self._discarded: dict | None = None  # the last summary of a sweep removed from its storage
        self._mine: set[int] = set()  # trials this driver asked or reattached (the failure guard looks at these)
        self._lock = threading.RLock()
        self.study = optuna.create_study(study_name=name, storage=self.storage, sampler=sampler_obj,
                                         pruner=make_pruner(pruner), direction=direction, load_if_exists=True)
        attrs = self.study.user_attrs
        if attrs.get("notebook") is None:
            self.study.set_user_attr("notebook", self.notebook)
            self.study.set_user_attr("objective", objective)
            for params in initial or ():  # known configurations to try first
                self.study.enqueue_trial(dict(params), skip_if_exists=True)
            self.resumed = False
        else:
            if attrs.get("notebook") != self.notebook or attrs.get("objective") != objective:
                raise SweepError(f"name: sweep {name!r} already exists in {self.storage} for notebook "
                                 f"{attrs.get('notebook')!r} with objective {attrs.get('objective')!r}; "
                                 "choose another name", field="name")
            if self.study.direction.name.lower() != direction:
                raise SweepError(f"direction: sweep {name!r} was created to {self.study.direction.name.lower()}",
                                 field="direction")
            self.resumed = True
        self._active: dict[int, tuple[Any, str]] = {}  # trial number -> (optuna Trial, job id)
        self._jobs: dict[int, dict] = {}  # trial number -> last job object seen
        self._reported: dict[int, int] = {}  # trial number -> last step reported to optuna
        self._curves: dict[int, list[tuple[int, float]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.error_traceback: str | None = None  # for bug reports when the driver itself crashed
        self.last_problem: str | None = None  # a transient problem (service unreachable...), cleared on success
        self._state = "created"
        self._reattach()

    # -- public ---------------------------------------------------------------------------------
    @property
    def client(self) -> Client:
        return get_client(self._client)

    @property
    def status(self) -> str:
        """created, running, finished, stopped or failed."""
        return self._state

    def start(self) -> "Sweep":
        """Run the driver in a background thread (returns at once)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._state = "running"
        self._thread = threading.Thread(target=self._run, name=f"gpupool-sweep-{self.name}", daemon=True)
        self._thread.start()
        return self

    def run(self) -> "Sweep":
        """Run the driver in the calling thread until the sweep is done."""
        self._stop.clear()
        self._state = "running"
        self._run()
        return self

    def wait(self, timeout: float | None = None, progress: bool = True) -> "Sweep":
        """Block until the sweep has finished; raises SweepError if it failed."""
        if self._thread is None and self._state == "created":
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        if progress:
            from .progress import Progress
            bar = Progress(f"sweep {self.name}")
        try:
            while self._thread is not None and self._thread.is_alive():
                if bar is not None:
                    bar.show(self._state, self._progress_text())
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"sweep {self.name} is still running after {timeout:g}s: {self._progress_text()}")
                self._thread.join(min(1.0, left) if left is not None else 1.0)
            if bar is not None:
                bar.show(self._state, self._progress_text())
        finally:
            if bar is not None:
                bar.close()
        if self._state == "failed":
            raise SweepError(f"sweep {self.name} failed: {self.error}")
        return self

    def stop(self, cancel: bool = False, timeout: float = 30.0) -> "Sweep":
        """Stop the driver. Running jobs keep running (``gpupool.sweep(name=...)`` reattaches)
        unless ``cancel``, which cancels them and marks their trials failed."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if cancel:
            with self._lock:
                for number, (trial, job_id) in list(self._active.items()):
                    try:
                        self.client.cancel(job_id)
                    except GPUPoolError:
                        pass
                    self._finish(number, "fail", reason="cancelled: the sweep was stopped")
        if self._state == "running":
            self._state = "stopped"
        return self

    def cancel(self) -> "Sweep":
        return self.stop(cancel=True)

    @property
    def done(self) -> bool:
        return self._state in ("finished", "failed", "stopped")

    @property
    def best(self) -> BestTrial | None:
        """The best completed trial: params, value and its job (None until one completed)."""
        import optuna
        with self._lock:  # the discard step deletes the study while holding the lock
            if self._discarded is not None:
                return None
            complete = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if not complete:
            return None
        pick = max if self.direction == "maximize" else min
        t = pick(complete, key=lambda t: t.value)
        job_id = t.user_attrs.get("job_id")
        job = Job({"id": job_id}, client=self._client) if job_id else None
        if job is not None:
            job._fetched = 0.0
        return BestTrial(t.number, dict(t.params), t.value, job)

    @property
    def trials(self):
        """All trials as a table: a pandas DataFrame when pandas is installed, else a TrialTable."""
        with self._lock:
            if self._discarded is not None:
                return TrialTable(["number", "state", "value"], [])
            frozen = self.study.get_trials(deepcopy=True)
        rows = []
        for t in frozen:
            if t.state.name == "WAITING":
                continue
            job = self._jobs.get(t.number, {})
            row = {"number": t.number, "state": t.state.name.lower(), "value": t.value}
            row.update({f"params_{k}": v for k, v in t.params.items()})
            row["job_id"] = t.user_attrs.get("job_id")
            row["job_status"] = job.get("status") or t.user_attrs.get("job_status")
            row["reason"] = t.user_attrs.get("reason") or job.get("reason")
            row["last_step"] = max(t.intermediate_values) if t.intermediate_values else None
            rows.append(row)
        try:
            import pandas as pd  # noqa: F401
        except ImportError:
            cols = ["number", "state", "value"] + [f"params_{k}" for k in self.dists] + \
                   ["job_id", "job_status", "last_step", "reason"]
            return TrialTable(cols, rows)
        with self._lock:
            if self._discarded is not None:
                return TrialTable(["number", "state", "value"], [])
            return self.study.trials_dataframe(attrs=("number", "value", "params", "state", "user_attrs"))

    def summary(self) -> dict:
        """Plain data for displays (SweepView, the CLI): counts, best, and each trial with its curve."""
        import optuna
        with self._lock:
            if self._discarded is not None:
                return {**self._discarded, "status": self._state, "error": self.error}
            frozen = self.study.get_trials(deepcopy=True)
        counts = {"complete": 0, "pruned": 0, "failed": 0, "running": 0}
        trials = []
        for t in frozen:
            if t.state == optuna.trial.TrialState.WAITING:
                continue
            state = {optuna.trial.TrialState.COMPLETE: "complete", optuna.trial.TrialState.PRUNED: "pruned",
                     optuna.trial.TrialState.FAIL: "failed"}.get(t.state, "running")
            counts[state] += 1
            job = self._jobs.get(t.number, {})
            curve = self._curves.get(t.number) or sorted(t.intermediate_values.items())
            trials.append({"number": t.number, "state": state, "value": t.value, "params": dict(t.params),
                           "job_id": t.user_attrs.get("job_id"),
                           "status": job.get("status") or t.user_attrs.get("job_status"),
                           "reason": t.user_attrs.get("reason") or job.get("reason") or "",
                           "curve": [(int(s), float(v)) for s, v in curve]})
        best = self.best
        return {"name": self.name, "status": self._state, "objective": self.objective,
                "direction": self.direction, "total": self.trials_total,
                "done": counts["complete"] + counts["pruned"] + counts["failed"], "counts": counts,
                "best": None if best is None else {"number": best.number, "value": best.value,
                                                   "params": best.params,
                                                   "job_id": best.job.id if best.job else None},
                "trials": trials, "error": self.error, "problem": self.last_problem}

    def __repr__(self) -> str:
        return f"<Sweep {self.name} {self._progress_text()}>"

    def _repr_html_(self) -> str:
        from gpupool.widgets.render import sweep_html
        return sweep_html(self.summary())

    # -- driver ---------------------------------------------------------------------------------
    def _progress_text(self) -> str:
        with self._lock:
            if self._discarded is not None:
                return f"sweep {self.name} {self._state}: nothing ran" + (f" ({self.error})" if self.error else "")
            trials = self.study.get_trials(deepcopy=False)
        finished = sum(1 for t in trials if t.state.is_finished())
        best = self.best
        b = f", best {self.objective}={best.value:.4g}" if best else ""
        return f"sweep {self.name} {self._state}: {finished}/{self.trials_total} trials done, {len(self._active)} active{b}" \
            + (f" ({self.error})" if self.error else "")

    def _reattach(self) -> None:
        """Pick up trials left RUNNING by an earlier driver (a restarted kernel)."""
        import optuna
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if not running:
            return
        by_name = None
        for t in running:
            job_id = t.user_attrs.get("job_id")
            if job_id is None:
                # The driver died between asking optuna and recording the job: look the job up by name.
                if by_name is None:
                    try:
                        by_name = {j.get("name"): j for j in self.client.jobs(sweep=self.name)}
                    except GPUPoolError as e:
                        raise SweepError(f"cannot reattach sweep {self.name}: {e}") from None
                job = by_name.get(self._job_name(t.number))
                if job is None:
                    _tell(self.study, t.number, state=optuna.trial.TrialState.FAIL)
                    self.study._storage.set_trial_user_attr(t._trial_id, "reason", "never submitted (driver stopped)")
                    continue
                job_id = job["id"]
                self.study._storage.set_trial_user_attr(t._trial_id, "job_id", job_id)
            trial = optuna.trial.Trial(self.study, t._trial_id)
            self._active[t.number] = (trial, job_id)
            self._mine.add(t.number)
            if t.intermediate_values:
                self._reported[t.number] = max(t.intermediate_values)

    def _job_name(self, number: int) -> str:
        return f"{self.name}-t{number}"

    def _run(self) -> None:
        backoff = self.poll
        try:
            while not self._stop.is_set():
                try:
                    self._poll_active()
                    if self._state != "running":
                        break
                    self._fill()
                    self.last_problem = None
                    backoff = self.poll
                except ConnectionFailed as e:  # transient: keep the sweep, retry with backoff
                    self.last_problem = str(e)
                    backoff = min(backoff * 2, 30.0)
                if not self._active and (self._n_trials() >= self.trials_total or self.error):
                    self._state = "failed" if self.error else "finished"
                    break
                self._stop.wait(backoff)
        except GPUPoolError as e:
            self.error = str(e)
            self._state = "failed"
        except Exception as e:  # never die silently in a background thread
            import traceback
            self.error = f"{type(e).__name__}: {e}"
            self.error_traceback = traceback.format_exc()
            self._state = "failed"
            logging.getLogger("gpupool.sweep").debug("sweep %s driver crashed", self.name, exc_info=True)
        if self._state == "failed":
            self._discard_if_nothing_ran()

    def _check_queue(self, queue: str | None) -> None:
        queues = self.client.queues()  # ConnectionFailed / Unauthorized say what is wrong
        if queue is None:
            return
        known = {q.get("name"): q for q in queues}
        if queue not in known:
            raise SweepError(f"queue: unknown queue {queue!r} (queues: {', '.join(map(str, known))})", field="queue")
        if not known[queue].get("may_submit", True):
            raise SweepError(f"queue: you may not submit to queue {queue!r}", field="queue")

    def _discard_if_nothing_ran(self) -> None:
        """A new sweep whose submissions were all refused ran nothing: remove its study (and the
        sqlite file it created), so no state is left behind and the name can be used again."""
        import optuna
        with self._lock:
            if self.resumed or any(t.user_attrs.get("job_id") for t in self.study.get_trials(deepcopy=False)):
                return
            final = self.summary()
            try:
                optuna.delete_study(study_name=self.name, storage=self.storage)
            except Exception:  # leave it rather than hide the sweep's own error
                return
            self._discarded = final
        if self._new_file is not None:
            try:
                if not optuna.study.get_all_study_names(storage=self.storage):
                    self._new_file.unlink()
            except Exception:
                pass

    def _n_trials(self) -> int:
        """Trials asked so far (enqueued ``initial`` ones waiting for their turn do not count)."""
        import optuna
        with self._lock:
            return sum(1 for t in self.study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING)

    def _fill(self) -> None:
        while (not self._stop.is_set() and not self.error and len(self._active) < self.parallel
               and self._n_trials() < self.trials_total):
            with self._lock:
                trial = self.study.ask(self.dists)
                self._mine.add(trial.number)
            params = {**self.parameters, **trial.params}
            body = build_body(self.notebook, parameters=params, kind=HPO_TRIAL, sweep=self.name,
                              name=self._job_name(trial.number), **self._submit_kw)
            try:
                job = self.client.submit(body)
            except ConnectionFailed:
                with self._lock:
                    _tell(self.study, trial, state=_state("FAIL"))
                    self.study._storage.set_trial_user_attr(trial._trial_id, "reason", "submission failed: service unreachable")
                raise
            except GPUPoolError as e:
                # The service refused the trial: every other trial would be refused alike.
                with self._lock:
                    trial.set_user_attr("reason", f"submission refused: {e}")
                    _tell(self.study, trial, state=_state("FAIL"))
                self.error = f"the service refused trial {trial.number}: {e}"
                return
            with self._lock:
                trial.set_user_attr("job_id", job["id"])
            self._active[trial.number] = (trial, job["id"])
            self._jobs[trial.number] = job

    def _poll_active(self) -> None:
        if not self._active:
            return
        listed = {j["id"]: j for j in self.client.jobs(sweep=self.name)}
        for number, (trial, job_id) in list(self._active.items()):
            job = listed.get(job_id)
            if job is None:
                try:
                    job = self.client.job(job_id)
                except NotFound:
                    self._finish(number, "fail", reason=f"job {job_id} no longer exists")
                    continue
            self._jobs[number] = job
            curve = metrics_of(job.get("metrics") or {}).get(self.objective, [])
            self._curves[number] = curve
            status = job.get("status")
            last = self._reported.get(number, -1)
            new = [(s, v) for s, v in curve if s > last and math.isfinite(v)]
            with self._lock:
                for s, v in new:
                    trial.report(v, s)
                    self._reported[number] = s
                prune = bool(new) and status not in ENDED and trial.should_prune()
            if prune:
                try:
                    self.client.cancel(job_id)
                except GPUPoolError:
                    pass
                self._finish(number, "pruned", reason=f"pruned at step {new[-1][0]}: "
                             f"{self.objective}={new[-1][1]:.4g} is behind the other trials", job_status=CANCELLED)
                continue
            if status == SUCCEEDED:
                if curve:
                    self._finish(number, "complete", value=curve[-1][1], job_status=status)
                else:
                    self._finish(number, "fail", job_status=status,
                                 reason=f"the notebook succeeded but never logged {self.objective!r} "
                                        "with gpupool.log_metric")
            elif status in ENDED:
                self._finish(number, "fail", job_status=status, reason=job.get("reason") or status)
        if self.error is None:
            self._failure_guard()

    def _finish(self, number: int, state: str, value: float | None = None, reason: str | None = None,
                job_status: str | None = None) -> None:
        entry = self._active.pop(number, None)
        if entry is None:
            return
        trial = entry[0]
        with self._lock:
            if reason:
                trial.set_user_attr("reason", reason)
            if job_status:
                trial.set_user_attr("job_status", job_status)
            if state == "complete":
                _tell(self.study, trial, value, skip_if_finished=True)
            else:
                _tell(self.study, trial, state=_state("PRUNED" if state == "pruned" else "FAIL"), skip_if_finished=True)

    def _failure_guard(self) -> None:
        import optuna
        with self._lock:
            finished = [t for t in self.study.get_trials(deepcopy=False)
                        if t.number in self._mine and t.state.is_finished()]
        if len(finished) >= _FAILURE_GUARD and all(t.state == optuna.trial.TrialState.FAIL for t in finished):
            self.error = (f"the first {len(finished)} trials all failed, stopping (last: "
                          f"{finished[-1].user_attrs.get('reason', 'unknown')})")


def _tell(study, trial, *args, **kw) -> None:
    """study.tell, tolerating samplers (GridSampler) that call study.stop() when their grid is used
    up: that only works inside optimize(); the driver counts trials itself, and optuna has stored the
    result before the sampler's after_trial raises."""
    try:
        study.tell(trial, *args, **kw)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise


def _state(name: str):
    import optuna
    return getattr(optuna.trial.TrialState, name)


def sweep(notebook, space: Mapping[str, Any], objective: str, *, direction: str = "maximize",
          trials: int | None = 20, parallel: int = 4, gpus: float | None = None, gpu_memory=None,
          queue: str | None = None, sampler="tpe", pruner="median", name: str | None = None,
          storage=None, parameters: Mapping[str, Any] | None = None, seed: int | None = None,
          poll: float = 2.0, priority: int | None = None, checkpoint_on_signal: bool | None = None,
          block: bool = False, initial: Sequence[Mapping[str, Any]] | None = None,
          pods: int | None = None, client: Client | None = None) -> Sweep:
    """Run a hyperparameter sweep over ``notebook``; returns a :class:`Sweep` at once.

    ``space`` maps parameter names to ``loguniform``/``uniform``/``intuniform``/``choice`` (or a
    list of values); ``objective`` is the metric the notebook logs with ``gpupool.log_metric``.
    ``parallel`` trials run at a time, each asking for ``gpus`` (per worker: ``pods=2`` makes every
    trial a distributed job of two workers started together; log the objective from rank 0). ``sampler`` is ``"tpe"``,
    ``"random"``, ``"grid"`` or an optuna sampler; ``pruner`` ``"median"`` (default), ``"hyperband"``,
    ``"successive_halving"``, ``None`` or an optuna pruner. Give ``name`` to resume the sweep later:
    the study lives in ``storage`` (default ``./.gpupool-sweeps.db``). The driver runs in a
    background thread; ``sweep.wait()`` blocks (or pass ``block=True``). ``initial`` lists
    parameter dicts to try first (e.g. a known-good configuration).
    """
    s = Sweep(notebook, space, objective, direction=direction, trials=trials, parallel=parallel, gpus=gpus,
              gpu_memory=gpu_memory, queue=queue, sampler=sampler, pruner=pruner, name=name, storage=storage,
              parameters=parameters, seed=seed, poll=poll, priority=priority,
              checkpoint_on_signal=checkpoint_on_signal, client=client, initial=initial, pods=pods)
    if block:
        s.run()
        if s.status == "failed":
            raise SweepError(f"sweep {s.name} failed: {s.error}")
        return s
    return s.start()


# -- space strings (CLI) -------------------------------------------------------------------------
_FUNC_RE = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$")


def parse_value(text: str):
    """'0.001' -> 0.001, '4' -> 4, 'true' -> True, 'null' -> None, anything else -> the string."""
    import json
    t = text.strip()
    try:
        return json.loads(t)
    except ValueError:
        low = t.lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return t


def parse_space_item(item: str) -> tuple[str, Any]:
    """'lr=loguniform(1e-5,1e-1)', 'layers=2,4,8', 'depth=intuniform(2,8)', 'opt=choice(adam,sgd)'."""
    if "=" not in item:
        raise SweepError(f"--space {item!r}: expected NAME=SPEC such as lr=loguniform(1e-5,1e-1) or layers=2,4,8",
                         field="space")
    name, spec = item.split("=", 1)
    name = name.strip()
    m = _FUNC_RE.match(spec)
    try:
        if m:
            fn, args = m.group(1).lower(), [parse_value(a) for a in m.group(2).split(",") if a.strip()]
            funcs = {"loguniform": loguniform, "uniform": uniform, "intuniform": intuniform, "int": intuniform,
                     "randint": intuniform, "choice": choice}
            if fn not in funcs:
                raise ValueError(f"unknown function {fn!r} (use loguniform, uniform, intuniform, choice)")
            if fn == "choice":
                return name, choice(*args)
            if len(args) not in (2, 3) or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
                raise ValueError(f"{fn}() takes two numbers (low, high)")
            return name, funcs[fn](*args)
        values = [parse_value(v) for v in spec.split(",") if v.strip()]
        if not values:
            raise ValueError("no values")
        return name, choice(*values) if len(values) > 1 else values[0]
    except (ValueError, TypeError) as e:
        raise SweepError(f"--space {item!r}: {e}", field="space") from None
