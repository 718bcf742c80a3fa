"""Push/pull progress a person can read: bytes done of total per layer, summed."""

from __future__ import annotations

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
    assert lines[-1] == "1/2 layers pushed, 50.0 of 200.0 MB (25%); in flight: aaa"
    transfer.update({"status": "Pushed", "id": "aaa"})
    transfer.done()
    assert lines[-1] == "2/2 layers pushed, 200.0 of 200.0 MB (100%)"


def test_progress_is_throttled() -> None:
    lines: list[str] = []
    transfer = Transfer("pulled", lines.append)
    for i in range(100):
        transfer.update(
            {"status": "Downloading", "id": "c", "progressDetail": {"current": i, "total": 100}}
        )
    assert lines == []  # nothing within the first interval
    transfer.done()
    assert lines == ["0/1 layers pulled, 0.0 of 0.0 MB (99%); in flight: c"]
