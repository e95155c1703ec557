"""tools/pd_timeline.py on a small trace written here: each wave's first and last steps, and the
backends' batch steps counted in the wave whose clock started before them."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "pd_timeline.py"


def _line(us, event, request, layer=-1, size=0):
    return f"[kvd] [debug] trace {us} {event} {request} {layer} {size}\n"


def _wave(t0, first_request):
    ids = [f"req-{first_request}", f"req-{first_request + 1}"]
    seq = 100 + first_request
    return [
        _line(t0, "ewave", ids[0]),
        _line(t0 + 50, "eloads", ids[0]),
        _line(t0 + 200, "loads", ids[0], -1, 2),
        _line(t0 + 300, "post", ids[0], 0, 1 << 20),
        _line(t0 + 320, "post", ids[1], 0, 1 << 20),
        # The backend's steps name its batches, whose numbers say nothing of the wave.
        _line(t0 + 360, "n_take", f"batch-{seq}"),
        _line(t0 + 400, "n_announced", f"batch-{seq}"),
        _line(t0 + 900, "n_acked", f"batch-{seq}"),
        _line(t0 + 950, "flushed", ids[0], 0),
        _line(t0 + 980, "flushed", ids[1], 0),
        _line(t0 + 1000, "einplace", ids[1], 0),
    ]


def _table(tmp_path, lines):
    log = tmp_path / "t.log"
    log.write_text("".join(lines))
    out = subprocess.run([sys.executable, str(SCRIPT), str(log), "--window", "2"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [l.split() for l in out.splitlines()]
    header = out.splitlines()[0]
    return header, {r[0]: r for r in rows[1:]}


def test_each_wave_shows_its_first_taken_and_landed_batch(tmp_path):
    header, rows = _table(tmp_path, _wave(1_000_000, 0) + _wave(1_100_000, 2))
    assert "first taken" in header and "first landed" in header
    assert set(rows) == {"0", "1", "p50"}
    # Columns: eloads loads request wanted want_in want post taken landed ... (µs from ewave).
    for wave in ("0", "1"):
        r = rows[wave]
        assert r[1:3] == ["50", "200"]
        assert r[7] == "300", r  # first post
        assert r[8] == "360", r  # first taken (n_take)
        assert r[9] == "900", r  # first landed (n_acked)
    assert rows["p50"][8:10] == ["360", "900"]


def test_every_post_is_when_the_last_request_of_the_wave_started_moving(tmp_path):
    header, rows = _table(tmp_path, _wave(1_000_000, 0) + _wave(1_100_000, 2))
    heads = header.split("  ")
    assert any("every post" in h for h in heads), header
    # The column after "last einplace": req-1's first post, 320 µs into each wave, not req-0's 300.
    for wave in ("0", "1", "p50"):
        assert rows[wave][15] == "320", rows[wave]


def test_warmup_waves_are_rows_of_their_own(tmp_path):
    warmup = [l.replace("req-", "warmup-") for l in _wave(900_000, 0)]
    _, rows = _table(tmp_path, warmup + _wave(1_000_000, 0) + _wave(1_100_000, 2))
    assert set(rows) == {"-1", "0", "1", "p50"}
    # Wave 0 on its own clock: its last layer in place 1000 µs in, not 101000 from the warm-up's.
    assert rows["0"][14] == "1000", rows["0"]
    assert rows["-1"][14] == "1000", rows["-1"]


def test_batch_steps_before_any_wave_clock_are_left_out(tmp_path):
    early = [_line(500, "i_take", "batch-7"), _line(600, "i_done", "batch-7")]
    _, rows = _table(tmp_path, early + _wave(1_000_000, 0))
    assert set(rows) == {"0"}
    assert rows["0"][8:10] == ["360", "900"]
