"""Live ipywidgets views of the pool (docs/widgets.md): ``QueueView``, ``GPUView``, ``JobView``,
``SweepView``, ``JobsView`` and ``dashboard()``. Rendering is pure (:mod:`gpupool.widgets.render`);
a background thread refreshes each view until ``close()``."""
from .views import Dashboard, GPUView, JobsView, JobView, QueueView, Refresher, SweepView, dashboard

__all__ = ["Dashboard", "GPUView", "JobView", "JobsView", "QueueView", "Refresher", "SweepView", "dashboard"]
