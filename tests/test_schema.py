"""The JSON Schemas in schemas/ are the reader's own: regenerated they are identical, they
accept every committed file, and they reject what the reader rejects."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest

from k3env.cli import main

from .conftest import REPO


def _generated(kind: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["schema", kind, "--json", "--lock", str(REPO / "pins/k3.lock.toml"),
                 "--images", str(REPO / "images")]) == 0  # fmt: skip
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


@pytest.mark.parametrize(
    ("kind", "committed"),
    [("lock", "schemas/lock.schema.json"), ("spec", "schemas/image-spec.schema.json")],
)
def test_committed_schema_is_what_the_reader_records(
    kind: str, committed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fails when a reader changes without `nox -s schemas` (k3env schema ... --out)."""
    assert json.loads((REPO / committed).read_text()) == _generated(kind, capsys)


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((REPO / "schemas" / name).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_every_committed_file_validates() -> None:
    _validator("lock.schema.json").validate(tomllib.loads((REPO / "pins/k3.lock.toml").read_text()))
    spec = _validator("image-spec.schema.json")
    for path in sorted((REPO / "images").glob("*.toml")):
        spec.validate(tomllib.loads(path.read_text()))


def test_a_misspelled_key_fails_the_schema_and_the_reader(repo: Path) -> None:
    lock = (REPO / "pins/k3.lock.toml").read_text()
    bad = lock.replace('digest = "unresolved"', 'digst = "unresolved"', 1)
    assert bad != lock
    errors = list(_validator("lock.schema.json").iter_errors(tomllib.loads(bad)))
    assert any("digst" in e.message for e in errors), [e.message for e in errors]
    (repo / "pins/k3.lock.toml").write_text(bad)
    assert main(["lock", "--check", "-q"]) == 2


def test_a_spec_value_of_the_wrong_type_fails_the_schema() -> None:
    data = tomllib.loads((REPO / "images/kimi-k3-direct-f.toml").read_text())
    data["patches"] = "mamba-hybrid-index-int64"  # a string, not an array
    with pytest.raises(jsonschema.ValidationError):
        _validator("image-spec.schema.json").validate(data)
