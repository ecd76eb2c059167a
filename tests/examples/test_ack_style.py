"""examples/elastic/ack_style.py: a script written like ACK's elastic example (`while check_alive(): train;
save; exit`), with only the import changed, stops at the wrapper's notice and resumes from what it saved."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "elastic" / "ack_style.py"


def test_an_ack_style_script_saves_and_exits_within_2_s_of_the_wrapper_notice_and_resumes(tmp_path: Path) -> None:
    private = tmp_path / "hpr-notice"
    private.mkdir(mode=0o700)
    notice = private / "notice"
    env = {
        **os.environ,
        "HPR_NOTICE_FILE": str(notice),
        "CKPT_DIR": str(tmp_path / "ckpt"),
        "TRAIN_STEPS": "100000",
        "TRAIN_STEP_SLEEP": "0.05",
    }
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0)  # it trains
        assert proc.poll() is None
        notice.write_text("grow back to 3 nodes")
        noticed = time.monotonic()
        out, _ = proc.communicate(timeout=10)
        took = time.monotonic() - noticed
    finally:
        proc.kill()
    assert proc.returncode == 0 and took < 2.0, (took, out)
    saved = int(out.split("saved step=")[1].split()[0])
    assert saved > 0
    # The relaunch (no notice for the new attempt) resumes from the saved step and runs to the end.
    notice.unlink()
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env={**env, "TRAIN_STEPS": str(saved + 5)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and f"saved step={saved + 5}" in done.stdout, done.stdout
