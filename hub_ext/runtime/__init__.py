"""The runtime layer: what runs in the service's process and carries decisions out. The scheduling
loop (an orchestrator) and its cycle worker, the job directory and environment of a run, memory
enforcement, the workspace reconciler, GPU sampling, the idle check, metrics. It imports the
domain and store layers and nothing of the web layer.
"""
