"""The cluster: one short Slurm job of the real image (its plan, its sbatch script, its
verdict collected from what the job wrote), on GPUs or a CPU partition."""
