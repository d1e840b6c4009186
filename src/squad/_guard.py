"""The guard of :mod:`squad.children`, run as a script: ``python -I -S _guard.py GRACE``.

stdin is a pipe only squad holds. Squad writes ``+ PGID`` for each process group it starts and
``- PGID`` once it has stopped it. End of file means squad is gone (exited or killed): every
group still registered gets SIGTERM, then SIGKILL after GRACE seconds, and the guard exits.
It imports nothing from squad (and nothing outside the standard library) so it starts fast.
"""

import os
import signal
import sys
import time


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    grace, groups = float(sys.argv[1]), set()
    for line in sys.stdin:
        op, _, pgid = line.partition(" ")
        if op == "+":
            groups.add(int(pgid))
        elif op == "-":
            groups.discard(int(pgid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in [g for g in groups if alive(g)]:
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass
        end = time.monotonic() + grace
        while any(alive(g) for g in groups) and time.monotonic() < end:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
