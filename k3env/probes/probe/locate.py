"""Where a module lives on the image's own sys.path, found without importing it (or its
parents). The builder runs this file's text as ``python -c TEXT --read MODULE...``: it prints
``{"modules": {module: file}, "files": {file: {b64, mode, uid, gid}}}``, each found file's
bytes (up to READ_LIMIT) with its stat, so one container both locates and reads a patch
target; without ``--read``, ``{module: file}``. The probe's patch check imports it, so the
two agree on where a module lives."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys

READ_LIMIT = 4 << 20  # a larger file is left for the host to read through the engine


def find_module_file(module: str) -> str | None:
    """The file of ``module`` on sys.path, without importing it (or its parents)."""
    parts = module.split(".")
    for d in sys.path:
        if not d or not os.path.isdir(d):
            continue
        stem = os.path.join(d, *parts)
        for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(cand):
                return os.path.realpath(cand)
    return None


def read_file(path: str) -> dict[str, object] | None:
    """A regular file's bytes (base64) and stat, as the image holds it; None past READ_LIMIT
    or unreadable here (the host then reads it through the engine, as before ``--read``)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > READ_LIMIT:
                return None
            data = f.read(READ_LIMIT + 1)
    except OSError:
        return None
    if len(data) > READ_LIMIT:
        return None
    return {"b64": base64.b64encode(data).decode(), "mode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid, "gid": st.st_gid}  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--read"]:
        found = {m: find_module_file(m) for m in sys.argv[2:]}
        files = {f: read_file(f) for f in sorted({f for f in found.values() if f})}
        print(json.dumps({"modules": found, "files": files}))
    else:
        print(json.dumps({m: find_module_file(m) for m in sys.argv[1:]}))
