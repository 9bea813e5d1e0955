"""A stop request inside a training step waits for the step's end; a second one stops at once.

The signals are sent to this process from inside the blocks, so each handler runs exactly where the test
says, with no timing luck.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlhfctl.run_signals import RunSignalled, safe_point_pending, step_in_progress, stop_on_signals, stop_requested
from tests.reliability.test_faults import sigint_not_ignored


def send(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs here at the latest


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_the_first_request_waits_for_the_steps_end_and_says_so(signum):
    notices, reached_the_end = [], False
    expected = KeyboardInterrupt if signum == signal.SIGINT else RunSignalled
    with pytest.raises(expected) as raised, sigint_not_ignored(), stop_on_signals():
        with step_in_progress(notices.append):
            send(signum)
            assert stop_requested()
            reached_the_end = True  # the step went on after the request
    assert reached_the_end
    assert notices == ["Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name]
    if signum != signal.SIGINT:
        assert raised.value.signum == signum


def test_a_second_request_inside_the_step_stops_at_once():
    after_second = False
    with pytest.raises(RunSignalled), stop_on_signals():
        with step_in_progress():
            send(signal.SIGTERM)
            send(signal.SIGTERM)
            after_second = True
    assert not after_second


def test_a_second_request_inside_a_checkpoint_write_still_waits_for_the_write():
    events = []
    with pytest.raises(RunSignalled), stop_on_signals():
        with step_in_progress():
            send(signal.SIGTERM)
            with safe_point_pending():
                send(signal.SIGUSR1)
                events.append("write finished")
            events.append("not reached")  # the second request stops at the write's end
    assert events == ["write finished"]


def test_a_request_during_a_write_inside_a_step_waits_for_the_step_not_just_the_write():
    events = []
    with pytest.raises(RunSignalled), stop_on_signals():
        with step_in_progress():
            with safe_point_pending():
                send(signal.SIGTERM)
            events.append("rest of the step")
    assert events == ["rest of the step"]


def test_nested_safe_points_keep_a_request_until_the_outer_one_ends():
    events = []
    with pytest.raises(RunSignalled), stop_on_signals():
        with safe_point_pending():
            with safe_point_pending():
                send(signal.SIGTERM)
            events.append("outer block goes on")
    assert events == ["outer block goes on"]


def test_no_request_no_stop():
    with stop_on_signals():
        with step_in_progress():
            pass
        assert not stop_requested()
