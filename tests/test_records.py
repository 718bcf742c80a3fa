"""k3env's state records: each kind read bounded and shape-checked, or an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3env.errors import K3envError, StateError
from k3env.image.records import Exported, PublishedAt, Pushed, SourceWheels, Tokenizers, read, write
from k3env.state import State

ID = "sha256:" + "ab" * 32
PUSHED = Pushed(image="f", image_id=ID, reference="r.io/k3env/f:1", digest="sha256:" + "cd" * 32,
                layers_sent=2, layers_skipped=1)  # fmt: skip


def test_a_record_reads_back_as_written_and_older_records_take_their_defaults(
    tmp_path: Path,
) -> None:
    state = State(tmp_path)
    assert read(state, Pushed, ID) is None  # no state directory at all
    write(state, PUSHED, ID)  # with by_digest and enroot_uri, derived: not read back
    assert (
        read(state, Pushed, ID) == PUSHED
        and '"enroot_uri"' in (tmp_path / "pushed" / ("ab" * 32 + ".json")).read_text()
    )
    write(state, PublishedAt(repositories=("a/b", "c/d")), ID)  # a JSON array, as before
    assert state.read_json("published-blobs", "ab" * 32 + ".json") == ["a/b", "c/d"]
    assert read(state, PublishedAt, ID) == PublishedAt(repositories=("a/b", "c/d"))
    for supported in (("kimi", "kimi_k2"), None):  # a tuple, or None
        write(state, Tokenizers(supported=supported), ID)
        assert read(state, Tokenizers, ID) == Tokenizers(supported=supported)
    old = {"image": "f", "image_id": ID, "path": "/x.sqsh", "sha256": "0" * 64, "size": 1,
           "mksquashfs": "4.5.1", "options": ["-comp", "lzo"]}  # fmt: skip
    state.write_json(old, "exports", "ab" * 32 + ".json")  # before `format` and `platform`
    got = read(state, Exported, ID)
    assert got is not None and (got.format, got.platform, got.options) == (
        0,
        "linux/amd64",
        ("-comp", "lzo"),
    )


@pytest.mark.parametrize(
    ("doc", "said"),
    [({"files": ["a.whl"]}, "'sha256' is missing"),
     ({"files": "a.whl", "sha256": []}, "'files' is a JSON string, not an array"),
     ({"files": [1], "sha256": []}, "'files' holds 1, not a str"),
     ({"files": [], "sha256": [], "x": float("nan")}, "not strict JSON")],
)  # fmt: skip
def test_a_record_not_of_its_shape_is_an_error_naming_the_file(
    tmp_path: Path, doc: object, said: str
) -> None:
    state = State(tmp_path)
    path = tmp_path / "source-wheels" / ("ab" * 32 + ".json")
    path.parent.mkdir()
    path.write_text(str(doc).replace("'", '"').replace("nan", "NaN"))
    with pytest.raises(StateError, match=said) as e:
        read(state, SourceWheels, ID)
    assert e.value.where == str(path)


def test_a_record_is_read_within_its_bound_and_never_through_a_link(tmp_path: Path) -> None:
    state = State(tmp_path)
    write(state, PUSHED, ID)
    path = tmp_path / "pushed" / ("ab" * 32 + ".json")
    path.write_bytes(b" " * (16 << 20) + b"{}")
    with pytest.raises(K3envError, match="over the limit"):
        read(state, Pushed, ID)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(K3envError, match="link"):
        read(state, Pushed, ID)
