"""A fractional job's GPU memory cap, handed to its frameworks before they touch the GPU.

The service puts the cap in the job's environment (:func:`gpupool.protocol.gpu_env`):
``GPUPOOL_GPU_MEMORY_FRACTION`` (a share of the whole GPU's memory, the driver's reserve already
left out) and ``GPUPOOL_GPU_MEMORY_LIMIT`` (bytes). JAX reads its own variables
(``XLA_CLIENT_MEM_FRACTION``, ``XLA_PYTHON_CLIENT_MEM_FRACTION``), set by the service. For the
others, :func:`install` (run by this directory's ``sitecustomize`` in every Python process of
the job) does, without importing any framework itself:

* **PyTorch 2.10 and later**: ``per_process_memory_fraction:<share>`` is added to
  ``PYTORCH_CUDA_ALLOC_CONF`` (the allocator reads it when CUDA starts; older versions refuse
  keys they do not know, so the installed version is read from its metadata first, and a value
  the user set is kept);
* **PyTorch, every version**: when ``torch`` is imported, ``torch.cuda.set_per_process_memory_fraction``
  is queued to run as CUDA initialises (``torch.cuda._lazy_call``, the hook PyTorch uses for its
  own seeds), so a process that never uses the GPU creates no CUDA context;
* **TensorFlow**: when ``tensorflow`` is imported, its first GPU gets a logical device with a
  memory limit of the cap (before the runtime starts; once it has, TensorFlow refuses and the
  cap is left to the other tiers).

Standard library only (it runs in kernels of environments without gpupool).
"""
import os
import sys

FRACTION = "GPUPOOL_GPU_MEMORY_FRACTION"
LIMIT = "GPUPOOL_GPU_MEMORY_LIMIT"
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_KEY = "per_process_memory_fraction"
ALLOC_KEY_SINCE = (2, 10)  # the first PyTorch whose CUDA allocator configuration knows the key

applied = {}  # what this process was told (tests and gpupool.checkpoint.limit_gpu_memory read it)


def cap():
    """(share of the GPU's memory, bytes) of this job's cap; (None, 0) when it has none."""
    try:
        share = float(os.environ.get(FRACTION) or "nan")
    except ValueError:
        share = float("nan")
    try:
        limit = int(os.environ.get(LIMIT) or 0)
    except ValueError:
        limit = 0
    if not 0.0 < share < 1.0:
        return None, limit
    return share, limit


def _version(dist):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return None
    try:
        text = metadata.version(dist)
    except Exception:
        return None
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else None


def alloc_conf(current, share):
    """``PYTORCH_CUDA_ALLOC_CONF`` with the share added (``current`` kept; a fraction the user
    set wins)."""
    items = [i for i in (current or "").split(",") if i.strip()]
    if any(i.split(":")[0].strip() == ALLOC_KEY for i in items):
        return ",".join(items)
    return ",".join(items + ["%s:%s" % (ALLOC_KEY, share)])


def torch_hook(torch, share):
    """Queue the fraction for when CUDA starts in this process (at once if it already has)."""
    cuda = getattr(torch, "cuda", None)
    setter = getattr(cuda, "set_per_process_memory_fraction", None)
    if setter is None:
        return False

    def apply_fraction():
        cuda.set_per_process_memory_fraction(share)
        applied["torch"] = share

    lazy = getattr(cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(apply_fraction)
    elif cuda.is_initialized():
        apply_fraction()
    else:
        return False
    applied["torch_queued"] = share
    return True


def tensorflow_hook(tf, limit):
    """A logical device with ``limit`` bytes on the first GPU TensorFlow lists."""
    config = getattr(tf, "config", None)
    if config is None or not limit:
        return False
    gpus = config.list_physical_devices("GPU")
    if not gpus:
        return False
    config.set_logical_device_configuration(gpus[0], [config.LogicalDeviceConfiguration(memory_limit=limit // 2**20)])
    applied["tensorflow"] = limit
    return True


class _AfterImport:
    """A finder on ``sys.meta_path`` that runs ``hooks[name](module)`` once ``name`` has been
    imported (its loader is wrapped; everything else is left to the other finders)."""

    def __init__(self, hooks):
        self.hooks = dict(hooks)

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, hook)
                return spec
        return None


class _Loader:
    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception as e:  # the import itself succeeded: never undo it
            sys.stderr.write("gpupool: start-up hook for %s failed: %s\n" % (module.__name__, e))

    def __getattr__(self, name):  # resources, get_code, is_package ...: the real loader's
        return getattr(self._loader, name)


def after_import(hooks):
    """Run ``hooks[name](module)`` once each module ``name`` is imported (at once for one already
    imported), through the one :class:`_AfterImport` finder of this process; returns the names
    still waiting for their import."""
    waiting = {}
    for name, hook in hooks.items():
        if name in sys.modules:  # imported before this ran (not at start-up): apply now
            hook(sys.modules[name])
        else:
            waiting[name] = hook
    if waiting:
        finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
        if finder is None:
            sys.meta_path.insert(0, _AfterImport(waiting))
        else:
            finder.hooks.update(waiting)
    return sorted(waiting)


def install(environ=None):
    """Hand this process's cap to the frameworks (a no-op without one); returns what it set up."""
    env = os.environ if environ is None else environ
    share, limit = cap()
    if share is None:
        return {}
    done = {"share": share}
    version = _version("torch")
    if version is not None and version >= ALLOC_KEY_SINCE:
        env[ALLOC_CONF] = alloc_conf(env.get(ALLOC_CONF), share)
        done["alloc_conf"] = env[ALLOC_CONF]
    done["hooks"] = after_import({"torch": lambda m: torch_hook(m, share),
                                  "tensorflow": lambda m: tensorflow_hook(m, limit)})
    return done
