"""What people edit and what the tool writes: the lock, image specs, cluster profiles, patch
files, read into frozen dataclasses (and edited in place)."""
