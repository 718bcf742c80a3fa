"""k3env probe: runs INSIDE a derived image, with the image's own Python and packages.

Carried into the container at run time (mounted read-only, never baked) as this directory and
started once per image as ``python DIR PLAN.json``, with no network. Stdlib only, plus whatever
the image has. Reads a plan (JSON) and writes one JSON document after ``MARK`` on stdout: each
plan's checks and the facts it learned.

Every check asks the image's own code: vLLM's and Dynamo's own argument parsers and
registries, Dynamo's Rust frontend loading a tokenizer, the files on the image's sys.path.
Module paths move between releases: each lookup tries the known places in order and says so
when none fits.

One module per concern: ``session`` (the process's state), ``harness`` (capture, lookups, the
forked copy), ``versions``, ``absent`` (importing past an absent module), ``imports``, ``args``
(the processes' own argument parsers), ``parsers`` (tool-call and reasoning registries),
``tokenizer``, ``patches``, ``envsearch`` (which file reads a baked name), ``group`` (one import
for images whose files are the same), ``main``. ``locate``, ``install`` and ``wheels`` are the
builder's in-container scripts (run as ``python -c`` with their own text).
"""
