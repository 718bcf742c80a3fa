"""Getting images to the cluster: push by digest, enroot squashfs export and check, srt-slurm
materialize/validate, recipes."""
