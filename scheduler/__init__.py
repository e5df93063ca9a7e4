"""gpupool scheduler core: pure, deterministic fair-share GPU scheduling."""
