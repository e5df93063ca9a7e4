"""Keeps a job's log to what the job says: ipykernel's warning that the kernel "is running over
TCP without encryption", which papermill's kernel prints at every start (and so every attempt of
every notebook job, in ``gpupool logs``), is dropped in the kernel itself.

The warning is about eavesdropping on the kernel's sockets. papermill's kernel listens on the
loopback interface of the job's own machine (or pod), its messages are signed with the key of its
connection file, and only the job's own papermill talks to it: there is nothing for the user to do
about it. Only that one record of ipykernel's application logger is dropped; everything else the
kernel logs stays. Standard library only (it runs in kernels of environments without gpupool)."""

TCP_WARNING = "Kernel is running over TCP without encryption"
KERNEL_APP = "ipykernel.kernelapp"  # the module whose import installs the filter
KERNEL_LOGGER = "IPKernelApp"  # traitlets names an application's logger after its class


class DropTCPWarning:
    """A ``logging`` filter (anything with ``filter(record)``) that drops the TCP warning."""

    def filter(self, record):
        return not str(getattr(record, "msg", "")).startswith(TCP_WARNING)


def kernel_app(_module=None):
    """Filter ipykernel's application logger (run once ``ipykernel.kernelapp`` is imported)."""
    import logging

    logger = logging.getLogger(KERNEL_LOGGER)
    if not any(isinstance(f, DropTCPWarning) for f in logger.filters):
        logger.addFilter(DropTCPWarning())


def install():
    """Run :func:`kernel_app` in this process once ipykernel's application is imported."""
    if __package__:  # imported as gpupool.startup.gpupool_quiet
        from . import gpupool_caps
    else:  # by the job's sitecustomize, from the start-up directory on the path
        import gpupool_caps

    return gpupool_caps.after_import({KERNEL_APP: kernel_app})
