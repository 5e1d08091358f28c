"""A hard time limit on a whole test, for tests that could otherwise wait forever."""

import contextlib
import signal


@contextlib.contextmanager
def fail_after(seconds: int, what_hung: str):
    """Raise TimeoutError in pytest's main thread if the block runs past ``seconds`` (SIGALRM; disarmed after)."""

    def give_up(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: {what_hung}")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
