"""gpupool's start-up hook: a directory that the runner of every job worker puts first on the
program's ``PYTHONPATH`` (:func:`gpupool.protocol.with_startup_hook`). Its ``sitecustomize``
hands a fractional job's GPU memory cap to PyTorch and TensorFlow (:mod:`.gpupool_caps`)."""
