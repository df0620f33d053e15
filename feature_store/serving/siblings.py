"""The workers of one ``serve --workers N``, for readiness: the server is ready when every
worker answers, not when the first does.

Each worker binds its own listening sockets (SO_REUSEPORT) when its lifespan starts, and
the kernel spreads new connections only over the sockets bound so far: a client that
connects as soon as one worker is ready (a load balancer's pool, wrk's connections, a gRPC
channel that lives for hours) stays on that worker while the others sit idle. So each worker
holds a file named by its pid in a directory ``serve`` makes, from when it answers on every
port until it stops, and readiness (``/readyz``, gRPC health, Feast's ``/health``) waits
until N live workers hold one. A worker that died without removing its file (SIGKILL, the
supervisor starting another) is not counted: its pid is gone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class Siblings:
    def __init__(self, directory: Path, workers: int) -> None:
        self.directory = directory
        self.workers = workers
        self.mine = directory / str(os.getpid())

    def join(self) -> None:
        """This worker answers on every port."""
        self.mine.touch()

    def leave(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.mine.unlink()

    def serving(self) -> int:
        """How many live workers answer; files of dead ones are removed."""
        count = 0
        with contextlib.suppress(FileNotFoundError):
            for path in self.directory.iterdir():
                if not path.name.isdigit():
                    continue
                try:
                    os.kill(int(path.name), 0)
                except ProcessLookupError:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    continue
                except PermissionError:
                    pass  # alive, another user's: not ours to judge
                count += 1
        return count

    def all_serving(self) -> bool:
        return self.serving() >= self.workers
