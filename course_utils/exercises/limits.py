"""A time limit on a learner's code that leaves nothing behind: no alarm armed, no thread running on."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading

from course_utils.validation import check_positive_number

__all__ = ["time_limit"]


class _TimeUp(BaseException):
    """Raised inside a learner's code that ran past its time limit (a BaseException: `except Exception` keeps out)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ``_TimeUp`` in the block's thread if it runs longer than ``seconds``; nothing is left armed after it.

    In the main thread (a notebook's cells) a SIGALRM timer interrupts even
    ``time.sleep``; elsewhere, or when SIGALRM is already in use, a watchdog
    thread raises in this thread at its next Python instruction. The alarm repeats every second until the block ends,
    so a learner's bare ``except:`` cannot swallow it for good.
    """
    check_positive_number(seconds, "seconds")  # 0 would disarm SIGALRM's timer: no limit at all
    done = threading.Event()
    # SIGALRM only when nobody else uses it (an armed timer or a handler of someone else's).
    alarm_is_free = (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
    )
    if alarm_is_free:

        def on_alarm(signum, frame):
            if not done.is_set():
                raise _TimeUp

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
        try:
            yield
        finally:
            done.set()
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        return
    target = ctypes.c_ulong(threading.get_ident())
    lock = threading.Lock()

    def watchdog():
        while not done.wait(seconds if not watchdog.fired else 1.0):
            with lock:
                if not done.is_set():
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(target, ctypes.py_object(_TimeUp))
                    watchdog.fired = True

    watchdog.fired = False
    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    try:
        yield
    finally:
        with lock:
            done.set()
            if watchdog.fired:  # drop an exception that was raised but not yet delivered
                ctypes.pythonapi.PyThreadState_SetAsyncExc(target, None)
