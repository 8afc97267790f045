"""Runs a command as a child subreaper, outside the sandbox: `python -I -S -B _reaper.py CMD...`.

bubblewrap's monitor exits as soon as the sandbox's init reports the exit status, before that
init has been reaped: the init is orphaned to the nearest subreaper, or PID 1, where it stays a
zombie if PID 1 is the worker itself (a container without an init). Started between the worker
and bwrap, this process adopts such orphans, reaps every one of them, then exits as the command
did (its code, or the same signal). Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    child = os.fork()
    if child == 0:
        try:
            os.execv(sys.argv[1], sys.argv[1:])
        finally:
            os._exit(127)
    status = 0
    while True:  # the command, then every orphan it left, until none is left
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = code
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
