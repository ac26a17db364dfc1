"""The bus's window: the last ``size`` event frames, by seq, packed in pages.

Theory of operation
-------------------
Observers read recent events from memory (``idled.server.engine.bus``); the window holds up to ``RECENT_EVENTS``
(100,000) frames. One ``bytes`` object per frame costs its 33-byte header and the allocator's rounding on top
of the frame's ~145 bytes, and a list slot: ~185 bytes a frame, 18 MB at 100,000. So frames are packed:

* the *open page* is a list of the newest frames (fewer than ``page``);
* when it holds ``page`` frames it is *sealed*: joined into one ``bytes`` with an ``array`` of their offsets,
  4 bytes a frame. A sealed page costs its frames' bytes plus ~4 bytes each;
* seqs are consecutive within a run, so every sealed page holds exactly ``page`` frames and a seq's page is
  arithmetic: ``(seq - first) // page`` from the oldest page's first seq;
* past ``size`` frames the oldest page goes, whole: the window holds between ``size - page + 1`` and ``size``
  frames once full. ``page`` is at most ``PAGE_FRAMES`` and at most an eighth of ``size`` (a window shrunk to a
  handful of frames in a test pages one frame at a time, and so keeps exactly ``size``);
* a seq that does not follow the last one (a standby's gap) empties the window first: it never serves a
  frame under the wrong seq.

Reading a sealed frame slices it out of its page: a copy of its ~150 bytes for each observer that reads it
from memory, where the list shared one object (~0.1 us a frame; observers that keep up get the open page's).
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import Final

__all__ = ["PAGE_FRAMES", "FrameWindow"]

PAGE_FRAMES: Final = 256  # frames a sealed page holds at most


class FrameWindow:
    __slots__ = ("size", "page", "next", "_count", "_pages", "_open")

    def __init__(self, size: int) -> None:
        self.size = size
        self.page = max(1, min(PAGE_FRAMES, size // 8))
        self.next = 0  # the seq that follows the newest frame
        self._count = 0  # frames held: seqs [next - _count, next)
        self._pages: list[tuple[bytes, array[int]]] = []  # oldest first: (joined frames, their offsets)
        self._open: list[bytes] = []  # the newest frames, not yet sealed

    def __len__(self) -> int:
        return self._count

    def oldest(self) -> int | None:
        """The oldest seq held (None: empty)."""
        return self.next - self._count if self._count else None

    def append(self, seq: int, frame: bytes) -> None:
        """The frame of ``seq``: the next one, or (any other seq) the first of an emptied window."""
        if seq != self.next:
            self._pages.clear()
            self._open.clear()
            self._count = 0
        self._open.append(frame)
        self.next = seq + 1
        self._count += 1
        if len(self._open) == self.page:
            offsets = array("I", accumulate(map(len, self._open), initial=0))
            self._pages.append((b"".join(self._open), offsets))
            self._open.clear()
        while self._count > self.size:  # (only sealed pages can take it past: the open one is under size / 8)
            del self._pages[0]
            self._count -= self.page

    def holds(self, seq: int) -> bool:
        """Whether the frame of ``seq`` is held (``oldest() <= seq < next``)."""
        return 0 <= seq - (self.next - self._count) < self._count

    def get(self, seq: int) -> bytes:
        """The frame of ``seq``, which must be held (``holds(seq)``; else IndexError)."""
        index = seq - (self.next - self._count)
        if not 0 <= index < self._count:  # (as holds(); a negative index would read another frame)
            raise IndexError(f"seq {seq} is not held: [{self.next - self._count}, {self.next})")
        sealed = len(self._pages) * self.page
        if index >= sealed:
            return self._open[index - sealed]
        joined, offsets = self._pages[index // self.page]
        at = index % self.page
        return joined[offsets[at]:offsets[at + 1]]
