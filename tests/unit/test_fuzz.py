"""A bounded atheris run over the config decoder and the placeholder renderer: 0 crashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FUZZER = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_config.py"
RUNS = 100_000


def test_fuzzing_the_decoder_finds_no_crash(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(FUZZER),
            f"-atheris_runs={RUNS}",
            "-max_len=512",
            "-seed=1",
            f"-artifact_prefix={tmp_path}/",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tail = result.stderr[-3000:]
    assert result.returncode == 0, tail
    assert f"Done {RUNS} in" in result.stderr, tail
    print(tail.splitlines()[-1])
