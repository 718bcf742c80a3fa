"""A small stand-in for the NVIDIA/srt-slurm repository, built as a real git repository.

No GitHub here: the tests need an "upstream" with tags, a ``srtctl`` entry point and a
marshmallow-style schema that rejects unknown fields at every level, plus PR patches made
with ``git format-patch``. Its shapes follow srt-slurm (``src/srtctl/core/config.py``'s
``load_config`` wraps a ValidationError whose ``messages`` nest like the recipe).
"""

from __future__ import annotations

import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

ENV = {
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "upstream@example.invalid",
    "GIT_COMMITTER_NAME": "upstream",
    "GIT_COMMITTER_EMAIL": "upstream@example.invalid",
    "GIT_AUTHOR_DATE": "2026-07-22T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-07-22T00:00:00Z",
    "PATH": "/usr/bin:/bin:/usr/local/bin",
    "HOME": "/tmp",
}

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "srtctl"
version = "1.0.36"
dependencies = ["pyyaml"]

[project.scripts]
srtctl = "srtctl.cli:main"

[tool.setuptools.packages.find]
where = ["src"]
"""

SCHEMA = '''\
"""Recipe schema: every level rejects unknown fields (like marshmallow's RAISE)."""


class ValidationError(Exception):
    def __init__(self, messages):
        super().__init__(messages)
        self.messages = messages


FRONTEND_TYPES = ("dynamo", "sglang", "trtllm_serve")
FREE = None  # a free-form mapping: any keys

SCHEMA = {
    "name": str,
    "model": {"path": str, "container": str, "precision": str},
    "resources": {"gpu_type": str, "gpus_per_node": int, "agg_nodes": int, "agg_workers": int},
    "frontend": {"type": str, "enable_multiple_frontends": bool},
    "backend": {"type": str, "aggregated_environment": FREE, "vllm_config": FREE},
    "dynamo": {"install": bool, "version": str, "hash": str},
    "benchmark": {"type": str, "isl": int, "osl": int},
    "environment": FREE,
    "setup_script": str,
}


def check(data, schema):
    errors = {}
    for key, value in data.items():
        if key not in schema:
            errors[key] = ["Unknown field."]
            continue
        kind = schema[key]
        if kind is FREE:
            continue
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                errors[key] = ["Not a valid mapping type."]
                continue
            nested = check(value, kind)
            if nested:
                errors[key] = nested
        elif not isinstance(value, kind):
            errors[key] = [f"Not a valid {kind.__name__}."]
    return errors


def validate(data):
    errors = check(data, SCHEMA)
    frontend = (data.get("frontend") or {}).get("type", "dynamo")
    if frontend not in FRONTEND_TYPES:
        errors.setdefault("frontend", {})["type"] = [
            "Must be one of: " + ", ".join(FRONTEND_TYPES) + "."
        ]
    if errors:
        raise ValidationError(errors)
    post_validate(data)


def post_validate(data):
    pass
'''

CONFIG = '''\
"""Load a recipe: YAML -> validated config (raises ValueError from ValidationError)."""

import yaml

from .schema import validate


def load_config(path):
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise TypeError(f"{path}: top level must be a mapping")
    try:
        validate(data)
    except Exception as e:
        raise ValueError(f"Invalid config in {path}: {e}") from e
    return data
'''

CLI = """\
import argparse
import sys

from .core.config import load_config


def main():
    parser = argparse.ArgumentParser(prog="srtctl")
    sub = parser.add_subparsers(dest="command", required=True)
    dry = sub.add_parser("dry-run")
    dry.add_argument("-f", required=True)
    args = parser.parse_args()
    load_config(args.f)
    print("dry-run ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
"""


@dataclass(frozen=True)
class Upstream:
    path: Path
    v1036: str  # tag v1.0.36
    pr278: str  # merged commit of "support direct aggregate serving" (tag v1.0.37)
    multinode: str  # the multi-node patch commit on top of PR #278
    patches: Path  # directory with the format-patch files


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def build(root: Path) -> Upstream:
    repo = root / "srt-slurm"
    core = repo / "src/srtctl/core"
    core.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "src/srtctl/__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    (core / "schema.py").write_text(SCHEMA)
    (core / "config.py").write_text(CONFIG)
    (repo / "src/srtctl/cli.py").write_text(CLI)
    v1036 = commit(repo, "srt-slurm v1.0.36")
    git(repo, "tag", "v1.0.36")

    schema = core / "schema.py"
    text = schema.read_text()
    schema.write_text(
        text.replace(
            'FRONTEND_TYPES = ("dynamo", "sglang", "trtllm_serve")',
            'FRONTEND_TYPES = ("dynamo", "sglang", "trtllm_serve", "vllm")',
        ).replace(
            "def post_validate(data):\n    pass\n",
            textwrap.dedent(
                """\
                def post_validate(data):
                    if (data.get("frontend") or {}).get("type") == "vllm":
                        if (data.get("resources") or {}).get("agg_nodes", 1) > 1:
                            raise ValidationError(
                                {"resources": {"agg_nodes": ["frontend.type vllm is single-node only."]}}
                            )
                """
            ),
        )
    )
    pr278 = commit(repo, "support direct aggregate serving (#278)")
    git(repo, "tag", "v1.0.37")
    text = schema.read_text()
    schema.write_text(
        text.replace(
            '        if (data.get("resources") or {}).get("agg_nodes", 1) > 1:',
            '        if (data.get("resources") or {}).get("agg_workers", 1) != 1:',
        ).replace(
            "frontend.type vllm is single-node only.", "frontend.type vllm needs agg_workers 1."
        )
    )
    multinode = commit(repo, "direct vllm frontend: vLLM-native multi-node serve")
    # A later release that touched the same lines again: PR #278 no longer reverses cleanly,
    # yet it is upstream (its commit is an ancestor of the tag).
    text = schema.read_text()
    schema.write_text(
        text.replace(
            'FRONTEND_TYPES = ("dynamo", "sglang", "trtllm_serve", "vllm")',
            'FRONTEND_TYPES = ("dynamo", "sglang", "trtllm_serve", "vllm", "mocker")',
        )
    )
    commit(repo, "frontend: mocker type")
    git(repo, "tag", "v1.0.38")
    patches = root / "patches"
    patches.mkdir()
    (patches / "pr278.patch").write_text(
        git(repo, "format-patch", "--stdout", f"{v1036}..{pr278}") + "\n"
    )
    (patches / "multinode.patch").write_text(
        git(repo, "format-patch", "--stdout", f"{pr278}..{multinode}") + "\n"
    )
    return Upstream(path=repo, v1036=v1036, pr278=pr278, multinode=multinode, patches=patches)
