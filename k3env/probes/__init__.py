"""Probes: stdlib-only scripts k3env carries into images (or srt-slurm venvs) and runs there."""
