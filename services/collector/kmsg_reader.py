"""Reading ``/dev/kmsg``: where to start, what was lost, and the cursor kept across restarts.

- **First start (no saved cursor):** skip the records already in the buffer (``SEEK_END``)
  and say so (``backlogSkipped: true``); when the seek is not possible, read everything and
  say ``false`` (COL-5).
- **Restart in the same boot:** resume right after the saved sequence number, so nothing is
  counted twice and nothing logged while the agent was down is missed.
- **New boot (boot id changed):** read the whole buffer once; faults logged during boot
  are not lost.
- **``--once``:** the whole current buffer, no cursor written.
- **``--slurm-health-check``:** a fresh process every few minutes that reads as one periodic
  agent would: the cursor as above, and the tally of the runs before kept next to it
  (``kmsg.tally``, valid for the cursor it was saved with), so each run folds only the records
  since the last one into counts that keep growing through the boot.
- ``EPIPE`` means the kernel overwrote records before we read them: logged, and reading goes
  on from the oldest record still there. Any other read error loses the reader; the caller
  reports the signal failed and retries with growing backoff capped at 60 s (COL-6).

On a character device every ``read()`` returns exactly one record. A FIFO or a regular file
(test fixtures, ``--root`` trees) is a byte stream, so records are split on lines: a line
that starts with a space continues the record before it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from healthplane_collector.kmsg import TallyState

READ_SIZE: Final = 8192
CURSOR_FILE: Final = "kmsg.cursor"
TALLY_FILE: Final = "kmsg.tally"


@dataclass(frozen=True, slots=True)
class Cursor:
    boot_id: str
    seq: int


def load_cursor(state_dir: Path) -> Cursor | None:
    try:
        data = json.loads((state_dir / CURSOR_FILE).read_text())
        return Cursor(str(data["bootId"]), int(data["seq"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_whole(state_dir: Path, name: str, data: bytes) -> None:
    """Written aside, then renamed: a reader never sees half a file, even after a crash."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, state_dir / name)


def save_cursor(state_dir: Path, cursor: Cursor) -> None:
    _write_whole(state_dir, CURSOR_FILE, json.dumps({"bootId": cursor.boot_id, "seq": cursor.seq}).encode())


class CarriedTally(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the runs before counted, up to and including record ``seq`` of boot ``boot_id``."""

    boot_id: str
    seq: int
    backlog_skipped: bool | None
    tally: TallyState


def load_tally(state_dir: Path, cursor: Cursor | None) -> CarriedTally | None:
    """The saved tally, when it is the one that goes with ``cursor``: another writer of the
    cursor (an agent run in between) or a garbled file means counting starts afresh."""
    if cursor is None:
        return None
    try:
        carried = msgspec.json.decode((state_dir / TALLY_FILE).read_bytes(), type=CarriedTally)
    except (OSError, msgspec.DecodeError):
        return None
    if (carried.boot_id, carried.seq) != (cursor.boot_id, cursor.seq):
        return None
    return carried


def save_tally(state_dir: Path, carried: CarriedTally) -> None:
    _write_whole(state_dir, TALLY_FILE, msgspec.json.encode(carried))


def _seq_of(raw: bytes) -> int | None:
    head = raw.split(b";", 1)[0].split(b",")
    if len(head) >= 2 and head[1].isdigit():
        return int(head[1])
    return None


class KmsgSource:
    """Non-blocking reads of raw records from a kmsg device, FIFO or file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.is_device = False
        self.is_fifo = False
        self._pending = b""
        self.overwritten = 0

    def open(self) -> None:
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        mode = os.fstat(self.fd).st_mode
        self.is_device = stat.S_ISCHR(mode)
        self.is_fifo = stat.S_ISFIFO(mode)
        if self.is_fifo:
            # Holding a write end ourselves means a FIFO never reads as EOF between writers,
            # so the reader waits for data instead of spinning on end-of-file.
            os.close(self.fd)
            self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._pending = b""

    def seek_end(self) -> bool:
        """Skip what is already in the buffer; False when this source cannot seek."""
        assert self.fd is not None
        if self.is_fifo:
            return False
        try:
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            return False
        return True

    def read_available(self) -> tuple[list[bytes], bool]:
        """Every record readable now, and whether the source reached its end (EOF on a
        FIFO whose writer left, or of a regular file). Raises OSError when the read is lost."""
        assert self.fd is not None
        records: list[bytes] = []
        while True:
            try:
                chunk = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                return records, False
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overwritten += 1  # the kernel moved on; the next read continues
                    continue
                if exc.errno == errno.EINVAL and self.is_device:
                    continue  # a record longer than our buffer: skip it
                raise
            if not chunk:
                if self._pending:
                    records.append(self._pending)
                    self._pending = b""
                return records, True
            if self.is_device:
                records.append(chunk)
            else:
                records.extend(self._split(chunk))

    def _split(self, chunk: bytes) -> list[bytes]:
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()  # an unfinished line waits for the rest
        out: list[bytes] = []
        current: list[bytes] = []
        for line in lines:
            if line.startswith(b" ") and current:
                current.append(line)
                continue
            if current:
                out.append(b"\n".join(current) + b"\n")
            current = [line] if line else []
        if current:
            # Writers of a FIFO or file write a record with its continuation lines at once,
            # so a complete line group is a complete record: release it without waiting.
            out.append(b"\n".join(current) + b"\n")
        return out


def resume_point(saved: Cursor | None, boot_id: str | None) -> tuple[str, int | None]:
    """Where to start: ``("end", None)`` skip the backlog, ``("all", None)`` read it all,
    ``("after", seq)`` resume after ``seq`` (same boot)."""
    if saved is None:
        return "end", None
    if boot_id is not None and saved.boot_id == boot_id:
        return "after", saved.seq
    return "all", None


def after(records: list[bytes], seq: int | None) -> list[bytes]:
    """Drop the records at or before ``seq`` (already counted before a restart)."""
    if seq is None:
        return records
    return [r for r in records if (_seq_of(r) or 0) > seq]


def last_seq(records: list[bytes]) -> int | None:
    for raw in reversed(records):
        found = _seq_of(raw)
        if found is not None:
            return found
    return None
