"""Pin bumps: which lock leaves change, the before/after evaluation, the pull request body."""
