"""k3env: pinned, patched, verified serving images for large models on Slurm."""

__version__ = "0.1.0"
