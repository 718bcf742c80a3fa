"""The package index's cut-off (`resolved_before`): the same lock resolves to the same bytes
whatever is uploaded after it, a newer closure is an `outdated` pin with the bump that takes it,
and a cut-off that has not settled is refused.

Real uv against a real (local) package index: PEP 691's JSON simple API with each file's
upload time, served on 127.0.0.1 from wheels built here, one of them uploaded after the cut-off.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import threading
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.config.cutoff import require_settled, settled_cutoff
from k3env.errors import LockError

from .conftest import REPO, make_wheel, replace_in

LOCK = Path("pins/k3.lock.toml")
REQ = Path("pins/twin.requirements.txt")
CUTOFF = "2026-03-01T00:00:00Z"
# (distribution, version, its requirements, upload time): k3probe-b 1.1 came after the cut-off.
RELEASES = [
    ("k3probe-a", "1.0", ["k3probe-b>=1.0"], "2026-01-01T00:00:00Z"),
    ("k3probe-b", "1.0", [], "2026-01-02T00:00:00Z"),
    ("k3probe-b", "1.1", [], "2026-06-01T00:00:00Z"),
]
# Shown by the index only later, claiming an upload time before the cut-off (an index or mirror
# that back-fills): `late` in the fixture's answer adds it.
LATE: tuple[str, str, list[str], str] = ("k3probe-b", "1.0.1", [], "2026-02-01T00:00:00Z")
MINIMAL_LOCK = f"""\
version = 1

[bases.cpu-twin]
kind = "twin"
python = "python3"

[twin]
debian_suite = "bookworm"
debian_mirror = "http://deb.debian.org/debian"
debian_packages = ["python3"]
requirements = "{REQ}"
requirements_sha256 = "unresolved"
requires = ["k3probe-a==1.0"]
resolved_before = "{CUTOFF}"
registry = "127.0.0.1:5000"
repository = "k3env/cpu-twin"
"""


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A PEP 691 index on 127.0.0.1 serving RELEASES with their upload times (and LATE
    behind ``/late/simple``)."""
    wheels = tmp_path / "files"
    wheels.mkdir()
    pages: dict[str, list[dict[str, object]]] = {}
    late: dict[str, list[dict[str, object]]] = {}
    for name, version, requires, uploaded in [*RELEASES, LATE]:
        w = make_wheel(wheels, name, version, requires)
        with zipfile.ZipFile(w) as z:  # PEP 658: the metadata beside the wheel
            meta = z.read(f"{w.name.split('-py3')[0]}.dist-info/METADATA")
        (wheels / f"{w.name}.metadata").write_bytes(meta)
        entries = late if (name, version) == LATE[:2] else pages
        entries.setdefault(name, []).append({
            "filename": w.name, "url": f"/files/{w.name}",
            "hashes": {"sha256": hashlib.sha256(w.read_bytes()).hexdigest()},
            "core-metadata": {"sha256": hashlib.sha256(meta).hexdigest()},
            "upload-time": uploaded,
        })  # fmt: skip

    class Index(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_error(405)

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            shown = [*pages.get(parts[-1], [])]
            if parts[0] == "late":  # the same index, later
                parts, shown = parts[1:], shown + late.get(parts[-1], [])
            if parts[0] == "simple" and len(parts) == 2 and parts[1] in pages:
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": parts[1],
                                   "files": shown}).encode()  # fmt: skip
                kind = "application/vnd.pypi.simple.v1+json"
            elif parts[0] == "files" and len(parts) == 2 and (wheels / parts[1]).is_file():
                body, kind = (wheels / parts[1]).read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def minimal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose lock pins only a twin resolved from k3probe-a."""
    root = tmp_path / "project"
    (root / "pins").mkdir(parents=True)
    (root / LOCK).write_text(MINIMAL_LOCK)
    monkeypatch.chdir(root)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    return root


def test_the_cutoff_gives_the_same_bytes_whatever_was_uploaded_after_it(
    minimal: Path, index: str
) -> None:
    assert main(["twin", "--resolve", "--index-url", index, "-q"]) == 0
    first = REQ.read_bytes()
    assert b"k3probe-b==1.0 " in first  # 1.1 is on the index, uploaded after the cut-off
    assert b"k3probe-b==1.1" not in first
    assert f"resolved before {CUTOFF}".encode() in first
    assert main(["lock", "--check", "-q"]) == 0
    REQ.unlink()
    assert main(["twin", "--resolve", "--index-url", index, "-q"]) == 0
    assert REQ.read_bytes() == first


def test_a_release_shown_later_with_an_earlier_upload_time_moves_nothing_until_refresh(
    minimal: Path, index: str
) -> None:
    """An index that back-fills (k3probe-b 1.0.1 appears later, claiming an upload before the
    cut-off): the committed versions are kept (sticky), the bytes stay; a refresh takes it."""
    assert main(["twin", "--resolve", "--index-url", index, "-q"]) == 0
    first = REQ.read_bytes()
    later = index.replace("/simple", "/late/simple")
    assert main(["twin", "--resolve", "--index-url", later, "-q"]) == 0
    assert REQ.read_bytes() == first
    replace_in(LOCK, CUTOFF, "2026-03-01T00:00:01Z")  # another cut-off: the same sticky pins
    assert main(["twin", "--resolve", "--index-url", later, "-q"]) == 0
    assert b"k3probe-b==1.0 " in REQ.read_bytes()
    assert main(["twin", "--resolve", "--refresh", "--index-url", later, "-q"]) == 0
    assert b"k3probe-b==1.1 " in REQ.read_bytes()


def test_outdated_names_the_newer_closure_and_the_bump_takes_it(
    minimal: Path, index: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["twin", "--resolve", "--index-url", index, "-q"]) == 0
    capsys.readouterr()
    assert main(["outdated", "--twin-index-url", index, "--json"]) == 0
    (twin,) = [p for p in json.loads(capsys.readouterr().out)["pins"] if p["pin"] == "twin"]
    assert twin["current"] == f"index before {CUTOFF}"
    assert twin["newer"] == ["linux/amd64: k3probe-b 1.0 -> 1.1"]
    settled = settled_cutoff()
    assert twin["bump"] == [f"k3env bump twin {settled}"]
    # The bump the workflow runs: the cut-off moved, the file regenerated, the lock consistent.
    assert main(["bump", "twin", settled, "--twin-index-url", index, "--edit-only", "-q"]) == 0
    assert b"k3probe-b==1.1 " in REQ.read_bytes()
    assert f'resolved_before = "{settled}"' in LOCK.read_text()
    assert main(["lock", "--check", "-q"]) == 0
    assert "pins/twin.requirements.txt: k3probe-b: 1.0 -> 1.1" in capsys.readouterr().out
    # Up to date now: nothing newer, no bump.
    assert main(["outdated", "--twin-index-url", index, "--json"]) == 0
    (twin,) = [p for p in json.loads(capsys.readouterr().out)["pins"] if p["pin"] == "twin"]
    assert twin["newer"] == [] and twin["bump"] == [] and not twin["outdated"]


def test_a_cutoff_that_has_not_settled_is_refused_and_nothing_is_written(
    minimal: Path, index: str, capsys: pytest.CaptureFixture[str]
) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    replace_in(LOCK, CUTOFF, soon)
    before = LOCK.read_bytes()
    assert main(["twin", "--resolve", "--index-url", index]) == 2
    err = capsys.readouterr().err
    assert f"the index cut-off {soon} is not settled" in err
    assert "twin.resolved_before" in err
    assert not REQ.exists() and LOCK.read_bytes() == before
    assert main(["bump", "twin", soon, "--edit-only"]) == 2
    assert LOCK.read_bytes() == before


def test_refresh_moves_the_cutoff_to_the_newest_settled_instant(minimal: Path, index: str) -> None:
    assert main(["twin", "--resolve", "--refresh", "--index-url", index, "-q"]) == 0
    assert f'resolved_before = "{settled_cutoff()}"' in LOCK.read_text()
    assert b"k3probe-b==1.1 " in REQ.read_bytes()
    assert main(["lock", "--check", "-q"]) == 0


def test_settled_means_a_day_or_more_in_the_past() -> None:
    now = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)
    assert settled_cutoff(now) == "2026-12-02T00:00:00Z"
    assert require_settled("2026-12-02T09:30:00Z", where="x", now=now)
    with pytest.raises(LockError, match="not settled"):
        require_settled("2026-12-02T09:30:01Z", where="x", now=now)
    with pytest.raises(LockError, match="is not a date"):
        require_settled("2026-02-30T00:00:00Z", where="x", now=now)


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        # Another cut-off in the lock than the file was resolved at.
        ('resolved_before = "2026-11-30T00:00:00Z"\n# CPU torch',
         'resolved_before = "2026-11-01T00:00:00Z"\n# CPU torch',
         "pins/cpu-twin.requirements.txt was resolved before 2026-11-30T00:00:00Z; "
         "[twin].resolved_before is 2026-11-01T00:00:00Z"),
        # Another input (a package left out) than the file was resolved from.
        ('omit = [\n  "aisimulate",', 'omit = [\n  "aisimulate", "zzz-left-out",',
         "pins/cpu-twin.requirements.txt was resolved from other inputs than [twin] now has"),
        # A variant's own cut-off.
        ('closure_sha256 = "', 'resolved_before = "2026-10-01T00:00:00Z"\nclosure_sha256 = "',
         None),
    ],
)  # fmt: skip
def test_lock_check_fails_offline_when_the_files_are_not_what_the_lock_resolves_to(
    repo: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, said: str | None
) -> None:
    assert main(["lock", "--check", "-q"]) == 0
    text = LOCK.read_text()
    if said is None:  # the variant's table already has one: replace it
        old = 'resolved_before = "2026-11-30T00:00:00Z"\n\n# The CPU build of vLLM 0.28.0'
        new = 'resolved_before = "2026-10-01T00:00:00Z"\n\n# The CPU build of vLLM 0.28.0'
        said = ("pins/variants/dynamo-1.5.1.requirements.txt was resolved before "
                '2026-11-30T00:00:00Z; [variants."dynamo-1.5.1".vllm].resolved_before is '
                "2026-10-01T00:00:00Z")  # fmt: skip
    assert old in text
    LOCK.write_text(text.replace(old, new, 1))
    assert main(["lock", "--check"]) == 4
    assert said in capsys.readouterr().out


def test_the_committed_debian_sets_are_pinned_by_sha256_each() -> None:
    """What CI checks of the Debian set without the mirror: every line a .deb by sha256."""
    from k3env.image.twindebian import read_debian_list

    for name in ("cpu-twin.debian.txt", "cpu-twin.arm64.debian.txt"):
        debs = read_debian_list(REPO / "pins" / name)
        assert len(debs) > 80, name
        assert {"python3", "ca-certificates", "dpkg"} <= set(debs), name
        assert all(len(d.sha256) == 64 for d in debs.values())


@pytest.mark.parametrize(("interrupt", "code"), [(KeyboardInterrupt, 130), (OSError, 3)])
def test_a_twin_bump_ended_while_it_is_judged_restores_the_lock_and_the_twin_files(
    minimal: Path,
    index: str,
    monkeypatch: pytest.MonkeyPatch,
    interrupt: type[BaseException],
    code: int,
) -> None:
    """`bump twin` writes the twin's files before it judges them: a Ctrl-C or an OSError while
    they are built and checked puts them back as they were, the lock included."""
    from k3env.bump.evaluate import Outcome

    from .fake_engine import FakeEngine

    assert main(["twin", "--resolve", "--index-url", index, "-q"]) == 0
    shutil.copytree(REPO / "clusters", minimal / "clusters")
    lock_before, req_before = LOCK.read_bytes(), REQ.read_bytes()
    seen = []

    def judge(lock: object, specs: object, **_: object) -> Outcome:
        seen.append(REQ.read_bytes())
        if len(seen) == 2:  # the bumped files are on disk, being judged
            raise interrupt("ended while judged")
        return Outcome(reports=(), preflight_errors={}, patches=(), twin=True)

    monkeypatch.setattr("k3env.bump.evaluate.evaluate", judge)
    monkeypatch.setattr("k3env.commands.bump.load_specs", lambda *_: [])  # the twin alone
    argv = ["bump", "twin", settled_cutoff(), "--twin-index-url", index, "--twin", "-q"]
    assert main(argv, engine=FakeEngine()) == code
    assert len(seen) == 2 and b"k3probe-b==1.1 " in seen[1]
    assert LOCK.read_bytes() == lock_before and REQ.read_bytes() == req_before


_SLOW_AFTER = """
import os, time
from pathlib import Path
import k3env.bump.evaluate as ev
import k3env.commands.app as app
import k3env.commands.bump as bump

calls = []

def judge(lock, specs, **_):
    calls.append(1)
    if len(calls) == 2:  # the bumped files written, the after build under way
        Path(os.environ["K3ENV_TEST_MARK"]).write_text("after")
        time.sleep(60)
    return ev.Outcome(reports=(), preflight_errors={}, patches=(), twin=True)

ev.evaluate = judge
bump.load_specs = lambda *_: []  # the twin alone
app.App.engine = lambda self: None  # no engine: the judging is the stand-in above
"""


def test_a_twin_bump_sent_sigterm_while_it_is_judged_restores_every_file(
    minimal: Path, index: str, tmp_path: Path
) -> None:
    """A real `k3env bump twin` process, SIGTERM'd (a cancelled CI job, a time limit) while
    the bumped files are judged: it exits 143 and the lock and the twin's files are
    byte-identical to before."""
    import signal
    import subprocess
    import sys
    import time

    assert main(["twin", "--resolve", "--index-url", index, "-q"]) == 0
    shutil.copytree(REPO / "clusters", minimal / "clusters")
    lock_before, req_before = LOCK.read_bytes(), REQ.read_bytes()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_AFTER)
    mark = tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": f"{site}:{REPO}", "K3ENV_TEST_MARK": str(mark)}
    argv = [sys.executable, "-m", "k3env", "bump", "twin", settled_cutoff(), "--twin-index-url",
            index, "--twin", "-q"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate(timeout=5)
    assert b"k3probe-b==1.1 " in REQ.read_bytes()  # written, being judged
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert b"terminated (SIGTERM)" in err
    assert LOCK.read_bytes() == lock_before and REQ.read_bytes() == req_before
