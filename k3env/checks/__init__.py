"""Verdicts: verify (probes run inside the image) and its report, preflight (rules over serve
profiles), serve-command parsing."""
