"""Run at the start of every Python process of a gpupool job (this directory is first on the
job's ``PYTHONPATH``): hand a fractional job's GPU memory cap to its frameworks
(:mod:`gpupool_caps`), keep ipykernel's TCP warning out of the job's log (:mod:`gpupool_quiet`),
then run the ``sitecustomize`` this one hides, if any (a distribution's
or a virtual environment's own), so nothing the process had before is lost.

Standard library only, and quiet: a kernel in an environment without gpupool runs it too, and a
failure here never stops the job's program."""
import importlib
import os
import sys


def _apply():
    try:
        import gpupool_caps

        gpupool_caps.install()
    except Exception as e:  # never in the way of the program
        sys.stderr.write("gpupool: GPU memory cap not handed to the frameworks: %s\n" % (e,))
    try:
        import gpupool_quiet

        gpupool_quiet.install()
    except Exception as e:
        sys.stderr.write("gpupool: the kernel's TCP warning is not filtered: %s\n" % (e,))


def _chain():
    """Import the next ``sitecustomize`` on the path (the one this module hides)."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.get(__name__)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        del sys.modules[__name__]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception as e:
        sys.stderr.write("gpupool: the environment's own sitecustomize failed: %s\n" % (e,))
    finally:
        sys.path[:] = saved
        if __name__ not in sys.modules and mine is not None:
            sys.modules[__name__] = mine


if __name__ == "sitecustomize":
    _apply()
    _chain()
