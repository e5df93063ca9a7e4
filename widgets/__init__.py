"""Live ipywidgets views of the pool (docs/widgets.md): ``QueueView``, ``GPUView``, ``JobView``,
``SweepView``, ``JobsView``, ``EndpointsView`` and ``dashboard()``. Rendering is pure
(:mod:`gpupool.widgets.render`); a background thread refreshes each view until ``close()``."""
from .views import Dashboard, EndpointsView, GPUView, JobsView, JobView, QueueView, Refresher, SweepView, dashboard

__all__ = ["Dashboard", "EndpointsView", "GPUView", "JobView", "JobsView", "QueueView", "Refresher", "SweepView",
           "dashboard"]
