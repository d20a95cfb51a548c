"""Bounded atheris runs over what the agent parses from outside: claim configs and the NRI wire; 0 crashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
RUNS = 100_000


@pytest.mark.parametrize("target", ["fuzz_config.py", "fuzz_nri.py"])
def test_fuzzing_finds_no_crash(target: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(FUZZ / target),
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
    print(f"{target}: {tail.splitlines()[-1]}")
