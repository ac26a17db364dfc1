"""idled.server.engine.window: the packed window holds the newest frames, each under its own seq."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from idled.server.engine.window import PAGE_FRAMES, FrameWindow


def frame(seq: int) -> bytes:
    return f"frame {seq} ".encode() * (1 + seq % 5)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 80), steps=st.lists(st.one_of(st.just(None), st.integers(0, 400)), max_size=300))
def test_a_suffix_of_what_was_appended_each_frame_under_its_seq(size: int, steps: list[int | None]) -> None:
    """``None``: the next seq; an int: a jump to that seq (the window starts again from it)."""
    window, run = FrameWindow(size), []
    for step in steps:
        seq = window.next if step is None else step
        if seq != window.next:
            run = []
        window.append(seq, frame(seq))
        run.append(seq)
        oldest = window.oldest()
        assert oldest is not None and window.next == seq + 1
        held = list(range(oldest, window.next))
        assert held == run[len(run) - len(held):]  # the newest frames of this run, none older than it
        assert size - window.page < len(held) <= size or len(held) == len(run)
        assert [window.get(s) for s in held] == [frame(s) for s in held]


def test_an_empty_window_holds_nothing() -> None:
    window = FrameWindow(100)
    assert window.oldest() is None and len(window) == 0


def test_packed_frames_cost_their_bytes_and_about_four_more() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        window = FrameWindow(100_000)
        for seq in range(20_000):
            window.append(seq, bytes(145))  # a fresh frame the size of an online event's, as the bus makes them
        per_frame = (tracemalloc.get_traced_memory()[0] - before) / len(window)
    finally:
        tracemalloc.stop()
    assert window.page == PAGE_FRAMES
    assert per_frame < 145 + 8, per_frame  # one bytes object per frame would cost ~185


def test_a_seq_not_held_is_an_error_not_another_frame() -> None:
    window = FrameWindow(16)  # pages of 2
    for seq in range(10, 40):
        window.append(seq, frame(seq))
    oldest = window.oldest()
    assert oldest is not None
    for seq in (oldest - 1, window.next, 0):
        try:
            window.get(seq)
        except IndexError:
            continue
        raise AssertionError(f"seq {seq} outside [{oldest}, {window.next}) gave a frame")
