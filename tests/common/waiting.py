"""Waiting with a deadline, for the tests that drive the real binary."""
import time


def wait_for(pred, seconds, poll=0.05):
    """True as soon as pred() is true; False when `seconds` pass first."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(poll)
    return False
