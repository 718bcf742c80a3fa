"""Push/pull progress a person can read: bytes done of total per layer, summed."""

from __future__ import annotations

import pytest

from k3env.engine.dockerd import Transfer


def test_push_progress_sums_layer_bytes_and_counts_finished_layers() -> None:
    lines: list[str] = []
    transfer = Transfer("pushed", lines.append)
    transfer.INTERVAL = 0.0  # every event may print here
    transfer.update({"status": "Preparing", "id": "aaa"})
    transfer.update({"status": "Layer already exists", "id": "bbb"})
    transfer.update(
        {
            "status": "Pushing",
            "id": "aaa",
            "progressDetail": {"current": 50_000_000, "total": 200_000_000},
        }
    )
    assert lines[-1] == (
        "[######------------------]  25% 50.0 of 200.0 MB, 1/2 layers pushed; in flight: aaa"
    )
    transfer.update({"status": "Pushed", "id": "aaa"})
    transfer.done()
    assert lines[-2:] == [
        "[########################] 100% 200.0 of 200.0 MB, 2/2 layers pushed",
        "",  # the end of the transfer: a terminal's status line gets its newline
    ]


def test_progress_is_throttled() -> None:
    lines: list[str] = []
    transfer = Transfer("pulled", lines.append)
    for i in range(100):
        transfer.update(
            {"status": "Downloading", "id": "c", "progressDetail": {"current": i, "total": 100}}
        )
    assert lines == []  # nothing within the first interval
    transfer.done()
    assert lines == [
        "[#######################-]  99% 0.0 of 0.0 MB, 0/1 layers pulled; in flight: c",
        "",
    ]


def test_a_status_is_redrawn_in_place_on_a_terminal_and_thinned_out_elsewhere(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from k3env.log import Log

    tty = Log(tty=True)
    for i in range(3):
        tty.live(f"{i}/3")
    tty.live("")
    tty.info("next")
    assert capsys.readouterr().err == "\r\x1b[K    0/3\r\x1b[K    1/3\r\x1b[K    2/3\nnext\n"
    clock = iter([100.0, 100.5, 101.0, 104.0, 105.0])
    monkeypatch.setattr("k3env.log.time.monotonic", lambda: next(clock))
    lines = Log(tty=False)
    for status in ("a", "b", "c", "d", "e"):
        lines.live(status)
    lines.live("")  # the last status always shows
    assert capsys.readouterr().err == "    a\n    d\n    e\n"
