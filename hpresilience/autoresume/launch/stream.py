"""Forwarding a step's output while the log rules and the progress stream read it.

One thread per stream reads whatever the pipe has (no waiting for a newline, so progress bars and
prompts reach the user as they come), writes the bytes to the user's stream (minus heartbeat lines and
the task labels the wrapper added, progress.OutputFilter), and hands whole lines to the progress stream
(labels on) and to the rule set (heartbeats off). srun's own error lines are kept for the classifier.
"""

from __future__ import annotations

import os
import threading
from typing import IO

from hpresilience.autoresume.progress import HEARTBEAT_PREFIX, OutputFilter, ProgressStream
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.lines import LineBuffer
from hpresilience.log import get_logger

log = get_logger("hpresilience.autoresume")


class Pump(threading.Thread):
    def __init__(
        self,
        source: IO[bytes],
        sink: IO[bytes],
        feed: RuleFeed,
        max_line_bytes: int,
        name: str,
        progress: ProgressStream | None = None,
        strip_labels: bool = False,
    ) -> None:
        super().__init__(name=f"pump-{name}", daemon=True)
        self.source = source
        self.sink = sink
        self.feed = feed
        self.progress = progress
        self.filter = OutputFilter(strip_labels)
        self.buffer = LineBuffer(max_line_bytes)
        self.stream = name

    def run(self) -> None:
        fd = self.source.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._forward(self.filter.push(chunk))
            text = self.buffer.push(chunk)
            if text:
                self._lines(text)
        self._forward(self.filter.flush())
        tail = self.buffer.flush()
        if tail:
            self._lines(tail)
        try:
            self.source.close()
        except OSError:
            pass

    def _lines(self, text: str) -> None:
        if self.progress is not None:
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            self.progress.feed_lines(lines)
            if HEARTBEAT_PREFIX in text:
                text = "".join(ln + "\n" for ln in lines if HEARTBEAT_PREFIX not in ln[:24])
        if text:
            self.feed.feed(text, self.stream)

    def _forward(self, chunk: bytes) -> None:
        if not chunk:
            return
        try:
            self.sink.write(chunk)
            self.sink.flush()
        except (OSError, ValueError) as err:
            # A closed or full user stream must not stop the reading, or srun would block on a full pipe.
            log.debug("output_forward_failed", error=str(err))
