"""gpupool: a fair-share GPU pool for JupyterHub."""
