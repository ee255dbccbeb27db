"""The rows of a sweep on disk, one JSON line per finished (point, workload), written as each one
finishes: what survives an interrupted sweep, and what a resumed one skips.

A row is keyed by its chip's fingerprint and its workload's hash, not by its point number, so
a row stays valid when axes gain values (the numbers shift) and is recomputed when the chip or
the workload changed. A sweep killed while writing leaves at most one torn last line, which is
dropped when the file is next opened.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ROWS = "rows.jsonl"


def row_key(fingerprint: str, workload_hash: str) -> str:
    return hashlib.sha256(f"{fingerprint} {workload_hash}".encode()).hexdigest()[:24]


class RowStore:
    def __init__(self, folder: str | os.PathLike, *, fresh: bool = False) -> None:
        self.folder = Path(folder)
        self.path = self.folder / ROWS
        if fresh:
            self.path.unlink(missing_ok=True)
        self.rows: dict[str, dict[str, Any]] = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        whole = data[:data.rfind(b"\n") + 1]
        if len(whole) != len(data):  # a torn last line: drop it, so appends start on a fresh line
            with open(self.path, "r+b") as f:
                f.truncate(len(whole))
        rows = {}
        for line in whole.decode().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "key" in row:
                rows[row["key"]] = row
        return rows

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def add(self, row: dict[str, Any]) -> None:
        """Keep `row` and append it to the file at once (flushed and synced: a kill loses nothing
        that was reported finished)."""
        self.rows[row["key"]] = row
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
