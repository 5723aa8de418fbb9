"""result.json is written whole, by whichever process writes it: two writers at once (both ranks of a
script whose Trainer counted itself process 0 on each) never rename each other's temporary file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WRITER = """
import sys
from pathlib import Path
from flightdeck.worker.train.result import write_result
for i in range(400):
    write_result(Path(sys.argv[1]), status="succeeded", message=f"{sys.argv[2]} {i}")
"""


def test_two_processes_writing_result_json_at_once_both_succeed_and_leave_one_whole_file(
    tmp_path: Path,
) -> None:
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), name], stderr=subprocess.PIPE, text=True
        )
        for name in ("rank0", "rank1")
    ]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert json.loads((tmp_path / "result.json").read_text())["message"].endswith(" 399")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary file left
