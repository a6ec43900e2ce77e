"""``--profile``: where a node spends its CPU, by stage, from a sampling profile.

The node has no per-stage CPU counters, so `py-spy <https://github.com/benfred/py-spy>`_ (the
``bench`` extra) attaches to the running node over the measured interval, samples its threads'
Python stacks (100 a second, without pausing it: ``--nonblocking``; threads waiting in the
kernel are not sampled, so a sample is a moment the thread was working) and writes them collapsed,
one line per distinct stack with its count (``--format raw``, which speedscope opens too).
:func:`stage_shares` gives the share of samples whose stack passes through each stage's code
(:data:`STAGES`). A stack may pass through two (the journal calling the store): shares overlap and
need not add up to 1. A sample in none is put down to the event loop itself when its innermost
Python frame is the loop's (uvloop's and grpc's compiled code, or the poll), to a waiting thread
when it is a wait of ``threading`` or ``queue``, and to ``other`` otherwise (metrics, the stall
watchdog, garbage collection).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

# Each stage and the code that is its own: a path fragment of the file (absolute paths, so the
# fragments hold the package directory and match whichever checkout the node runs from).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("write-ahead", ("/fastlane/engine/write_ahead.py", "/fastlane/engine/window.py")),
    ("release", ("/fastlane/engine/release.py",)),
    ("dispatch", ("/fastlane/engine/dispatch/dispatcher.py",)),
    ("journal", ("/fastlane/engine/dispatch/journal.py",)),
    ("stream", ("/fastlane/server/servicers/workers.py", "/grpc/")),
    ("database", ("/fastlane/storage/", "/asyncpg/", "/aiosqlite/")),
)
# Samples in no stage, by their innermost Python frame: the event loop itself (uvloop's and
# grpc's compiled code, which py-spy does not see into without --native, or its poll, which it
# cannot always tell from work), and threads that py-spy counted while they waited (a timed wait
# wakes often); then the rest.
LOOP = "event loop (compiled code or poll)"
WAITING = "threads waiting"
OTHER = "other"
LOOP_FILES = ("/asyncio/runners.py", "/asyncio/base_events.py", "/uvloop/__init__.py")
WAIT_FILES = ("/threading.py", "/queue.py", "/selectors.py")
SAMPLE_RATE = 100  # per second: py-spy's default
STOP_TIMEOUT_S = 30.0  # for py-spy to write its file once told to stop


def py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (a virtual environment's bin), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def frame_file(frame: str) -> str:
    """The file of one collapsed frame, ``function (file)`` or ``function (file:line)``."""
    inside = frame.rpartition(" (")[2].removesuffix(")")
    path, colon, line = inside.rpartition(":")
    return path if colon and line.isdigit() else inside


def frame_function(frame: str) -> str:
    return frame.rpartition(" (")[0]


def _unstaged(frames: list[str]) -> str:
    """Where a sample in no stage goes: :data:`LOOP`, :data:`WAITING` or :data:`OTHER`."""
    leaf = frames[-1]
    path = frame_file(leaf)
    if path.endswith(LOOP_FILES):
        return LOOP
    if path.endswith(WAIT_FILES) and any(word in frame_function(leaf).lower() for word in ("wait", "get", "select")):
        return WAITING
    return OTHER


def stage_shares(lines: Iterable[str]) -> dict[str, object]:
    """From collapsed stacks (``frame;frame;... count`` per line): the samples, and the share of
    them whose stack passes through each stage's code (``stages``, in :data:`STAGES` order, then
    those in none: :data:`LOOP`, :data:`WAITING` and :data:`OTHER`)."""
    counts = dict.fromkeys([name for name, _ in STAGES] + [LOOP, WAITING, OTHER], 0)
    total = 0
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        files = [frame_file(frame) for frame in frames]
        hit = False
        for name, fragments in STAGES:
            if any(fragment in path for path in files for fragment in fragments):
                counts[name] += count
                hit = True
        if not hit:
            counts[_unstaged(frames)] += count
    return {"samples": total,
            "stages": {name: round(count / total, 4) if total else None for name, count in counts.items()}}


class Profiler:
    """py-spy attached to one process from :meth:`start` to :meth:`stop`, writing ``path``."""

    def __init__(self, name: str, pid: int | None, path: Path) -> None:
        self.name = name
        self._pid = pid
        self.path = path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log = path.with_suffix(".log")
        self.error: str | None = None

    def start(self) -> None:
        executable = py_spy()
        if executable is None:
            self.error = "py-spy is not installed (it comes with the bench extra)"
            return
        if self._pid is None:
            self.error = f"{self.name} is not running"
            return
        with open(self._log, "wb") as log:
            self._popen = subprocess.Popen(
                [executable, "record", "--pid", str(self._pid), "--format", "raw", "--rate", str(SAMPLE_RATE),
                 "--nonblocking", "--full-filenames", "--nolineno", "--output", str(self.path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> dict[str, object]:
        """Stop sampling (py-spy writes its file on SIGINT); the shares, or ``error``."""
        popen, self._popen = self._popen, None
        if popen is not None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGINT)
            try:
                popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        figures: dict[str, object] = {"process": self.name, "file": self.path.name, "rate_hz": SAMPLE_RATE}
        if self.error is None:
            try:
                with open(self.path) as collapsed:
                    figures.update(stage_shares(collapsed))
            except OSError:
                tail = self._log.read_text(errors="replace")[-500:] if self._log.exists() else ""
                self.error = f"py-spy wrote no profile: {tail.strip() or 'no output'}"
        if self.error is not None:
            figures["error"] = self.error
        return figures

    def abandon(self) -> None:
        """Kill py-spy if it is still attached (left so by an error); nothing once stopped."""
        popen, self._popen = self._popen, None
        if popen is not None:
            popen.kill()
            popen.wait()


def profile_file(workdir: Path, label: str) -> Path:
    """Where the profile of ``label`` goes: the scratch directory, copied to ``--out DIR/logs``."""
    return workdir / f"{label}-profile.txt"

