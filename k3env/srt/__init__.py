"""srt-slurm, NVIDIA's Slurm launcher: its pinned release materialized with its PR patches and
validated, recipes judged (both schemas), written and migrated, adopted into image specs."""
