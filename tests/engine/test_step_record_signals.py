"""A cancel or the scheduler's interrupt that arrives while a step's record is written waits until
the record is whole, so the event file and the trackers hold the same steps (a SIGTERM between the
metrics event and MLflow's log once left MLflow one step short). Real signals to this process."""
import os
import signal

import pytest

from workbench.engine.trainer import SIGTERM_ENV, Cancelled, Interrupted, _signals_cancel, _StepRecord


@pytest.mark.parametrize("signum, mode, stop", [(signal.SIGTERM, "cancel", Cancelled), (signal.SIGINT, "cancel", Cancelled),
                                                (signal.SIGTERM, "interrupt", Interrupted)])
def test_a_signal_inside_the_record_is_raised_after_it(monkeypatch, signum, mode, stop):
    monkeypatch.setenv(SIGTERM_ENV, mode)
    written = []
    with _signals_cancel(), pytest.raises(stop):
        with _StepRecord.whole():
            written.append("metrics")
            os.kill(os.getpid(), signum)
            written.extend(["samples", "tracker"])  # the handler ran above and did not stop the record
        written.append("next step")
    assert written == ["metrics", "samples", "tracker"]
    assert _StepRecord.pending is None and not _StepRecord.writing


def test_a_signal_outside_the_record_stops_at_once():
    written = []
    with _signals_cancel(), pytest.raises(Cancelled):
        os.kill(os.getpid(), signal.SIGINT)
        written.append("generation")
    assert written == []


def test_an_error_inside_the_record_wins_over_a_pending_cancel():
    """The record failed: its error (the run's failure, with the traceback) propagates, and the pending
    signal is not raised over it."""
    with _signals_cancel(), pytest.raises(OSError):
        with _StepRecord.whole():
            os.kill(os.getpid(), signal.SIGTERM)
            raise OSError("disk full")
    assert not _StepRecord.writing
