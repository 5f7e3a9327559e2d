"""The fixture of the hostile-input tests: a small disk to fill."""

from __future__ import annotations

import os
import subprocess

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs; root only."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode:
        pytest.skip("a full disk needs a tmpfs, which only root can mount")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)
