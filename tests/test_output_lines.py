"""Progress bars redrawn with "\r" (tqdm, Keras) reach the log as they advance, throttled."""

import time

import pytest
import rank_functions as rf

from airflow_provider_hvd import HorovodRunner
from airflow_provider_hvd.runner.barrier.output_lines import LineAssembler


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def assembler(interval=1.0):
    clock, shown = Clock(), []
    return LineAssembler(shown.append, interval=interval, clock=clock), clock, shown


def test_a_fast_bar_shows_its_latest_state_once_a_second_and_its_final_state():
    lines, clock, shown = assembler()
    for step in range(1, 301):  # 300 redraws in 3 s
        lines.feed(f"\r{step}/300")
        clock.now += 0.01
    lines.feed("\n")
    assert shown == ["1/300", "101/300", "201/300", "300/300"]


def test_a_bar_that_pauses_shows_where_it_stopped_when_its_second_is_up():
    lines, clock, shown = assembler()
    lines.feed("\r1/10")
    lines.feed("\r2/10")
    clock.now += 0.3
    lines.feed("\r3/10")
    assert lines.due() == pytest.approx(101.0)
    clock.now += 0.8  # no more output: the launcher's pump wakes at due() and ticks
    lines.tick()
    assert shown == ["1/10", "3/10"]
    assert lines.due() is None  # nothing new to show: the pump sleeps until output comes


def test_ordinary_lines_are_never_held_back_or_dropped():
    lines, clock, shown = assembler()
    lines.feed("one\n\ntwo\r\nthree\r\nfour")
    assert shown == ["one", "", "two", "three"]
    lines.close()
    assert shown[-1] == "four"


def test_a_keras_style_bar_ends_with_its_final_state_and_the_next_line_is_not_throttled():
    lines, clock, shown = assembler()
    lines.feed("1/3 [=>...]\r2/3 [==>..]")
    clock.now += 0.1
    lines.feed("\r3/3 [=====] - loss: 0.1\n")
    lines.feed("Epoch 2/2\n")
    assert shown == ["2/3 [==>..]", "3/3 [=====] - loss: 0.1", "Epoch 2/2"]


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_a_real_tqdm_bar_reaches_the_log_while_it_runs(launcher, no_leftovers):
    got = []  # (arrival time, rank, stream, line)
    HorovodRunner(np=-2, launcher=launcher,
                  log_sink=lambda rank, stream, line: got.append((time.monotonic(), rank, stream, line))
                  ).run(rf.tqdm_bar, steps=60, step_s=0.05)
    assert not any("\r" in line for _, _, _, line in got)
    for rank in (0, 1):
        bar = [(t, line) for t, r, stream, line in got if r == rank and stream == "stderr" and line.startswith("train:")]
        # tqdm redrew 60 times in about 3 s: the log got at most one state a second, then the final one
        # (the bound follows the bar's own duration, so a slow machine cannot fail it) ...
        shown_for = bar[-1][0] - bar[0][0]
        assert 2 <= len(bar) <= shown_for + 2, bar
        assert "100%" in bar[-1][1] and "60/60" in bar[-1][1], bar
        # ... as the bar advanced, not in one burst at the end.
        assert shown_for >= 1.5, bar
        assert any(r == rank and line == "bar done" for _, r, _, line in got)
