"""Secret and ConfigMap volumes laid out as the kubelet lays them out (for `mpijob_harness` and
`trainjob_harness`)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def kubelet_volume(root: Path, files: dict[str, tuple[bytes, int]], group: int | None) -> Path:
    """Lay out `files` (name: content, mode) as the kubelet's atomic writer does: the data in a
    timestamped folder, ``..data`` pointing at it, one symlink per key; owned by root and the
    fsGroup `group`, which (a read-only volume) adds group read to each mode."""
    gid = group if group is not None else 0
    data = root / time.strftime("..%Y_%m_%d_%H_%M_%S.000000000")
    data.mkdir(parents=True)
    for name, (content, mode) in files.items():
        path = data / name
        path.write_bytes(content)
        os.chown(path, 0, gid)
        path.chmod(mode | 0o440 if group is not None else mode)
        (root / name).symlink_to(f"..data/{name}")
    (root / "..data").symlink_to(data.name)
    for folder, folder_mode in ((data, 0o2755 if group is not None else 0o755), (root, 0o3777)):
        os.chown(folder, 0, gid)
        folder.chmod(folder_mode if group is not None else folder_mode & 0o1777)
    return root


def kubelet_swap(root: Path, files: dict[str, tuple[bytes, int]], group: int | None) -> None:
    """Update a volume `kubelet_volume` made, as the atomic writer does: new data in a new
    folder, then ``..data`` renamed over to point at it."""
    gid = group if group is not None else 0
    data = root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.time_ns() % 10**9:09d}"
    data.mkdir()
    for name, (content, mode) in files.items():
        (data / name).write_bytes(content)
        os.chown(data / name, 0, gid)
        (data / name).chmod(mode | 0o440 if group is not None else mode)
    data.chmod(0o2755 if group is not None else 0o755)
    staged = root / "..data_tmp"
    staged.symlink_to(data.name)
    staged.replace(root / "..data")
