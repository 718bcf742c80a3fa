"""The export's tar filter: what mksquashfs -tar would get wrong is put right on the way."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from k3env.image.tarstream import entries, filter_tar


def _tar_with_pax_symlink(target: str) -> bytes:
    """What docker export writes beside a non-ASCII name: the target in a pax linkpath."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        link = tarfile.TarInfo("etc/ssl/certs/Türk.pem")
        link.type = tarfile.SYMTYPE
        link.linkname = target
        link.pax_headers = {"linkpath": target}
        tar.addfile(link)
    return buf.getvalue()


@pytest.mark.parametrize(
    "target",
    ["/usr/share/ca-certificates/x.crt", "/usr/share/" + "y" * 150 + "/z.crt"],
    ids=["fits-ustar", "long"],
)
def test_an_absolute_symlink_target_survives_mksquashfs(tmp_path: Path, target: str) -> None:
    out = b"".join(filter_tar([_tar_with_pax_symlink(target)], lambda n: False, b""))
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        (member,) = tar.getmembers()
    assert member.issym() and member.linkname == target and member.name.endswith("Türk.pem")
    if shutil.which("mksquashfs") is None:
        pytest.skip("squashfs-tools not installed")
    sqsh = tmp_path / "x.sqsh"
    subprocess.run(
        ["mksquashfs", "-", str(sqsh), "-tar", "-noappend", "-quiet", "-no-progress"],
        input=out,
        check=True,
    )
    listing = subprocess.run(
        ["unsquashfs", "-lln", str(sqsh)], capture_output=True, text=True, check=True
    ).stdout
    assert f"-> {target}" in listing  # the leading '/' is kept


def test_fixed_mtimes_are_set_where_asked() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("etc/hostname", "etc/keep"):
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_123
            tar.addfile(info, io.BytesIO(b""))
    out = b"".join(
        filter_tar([buf.getvalue()], lambda n: False, entries([], 0), mtimes={"etc/hostname": 7})
    )
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        times = {m.name: m.mtime for m in tar}
    assert times == {"etc/hostname": 7, "etc/keep": 1_700_000_123}


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("size", [1, 7, 512, 4096, 1 << 16])
def test_the_filter_is_the_same_whatever_the_chunks(size: int) -> None:
    files = {"a": b"x" * 1000, "dev/null": b"", "b/c": bytes(range(256)) * 40, "d": b""}
    stream = _tar(files)
    chunks = [bytearray(stream[i : i + size]) for i in range(0, len(stream), size)]
    out = b"".join(filter_tar(chunks, lambda n: n.startswith("dev/"), b""))
    whole = b"".join(filter_tar([stream], lambda n: n.startswith("dev/"), b""))
    assert out == whole
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == {k: v for k, v in files.items() if not k.startswith("dev/")}


def test_a_stream_cut_inside_an_entry_is_refused() -> None:
    stream = _tar({"big": b"y" * 5000})
    with pytest.raises(ValueError, match="ended inside 'big'"):
        b"".join(filter_tar([stream[:2000]], lambda n: False, b""))
