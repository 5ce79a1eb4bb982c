"""A background thread that handles what is queued for it, in order, away
from the call that queued it: the autoloader's report sender (_report)
and its lease-ahead worker (_ahead). The thread is started on first use,
wait() blocks until what was queued before it is handled, and a forked
child starts with no thread and no queue (the parent's thread is not in
it): its first put starts its own."""

import logging
import os
import queue
import threading


class _Handled(threading.Event):
    """Queued by wait(): set once the items queued before it are handled."""


class QueueThread:
    """A daemon thread named name that calls handle(item) for each item
    put, in order; with batch, handle(items) with the list of all the
    items waiting when it looks (at least one, in order). An exception
    handle raises is logged (debug) and the thread goes on."""

    def __init__(self, name, handle, batch=False):
        self.name = name
        self._handle = handle
        self._batch = batch
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        """No thread, no queue: also a forked child's start."""
        self._lock = threading.Lock()
        self._queue = None  # queue.SimpleQueue of items and _Handled markers
        self._thread = None  # the thread that empties it

    def start(self):
        """Start the thread if there is none: True when this call started
        it. Raises RuntimeError where no thread can be started: then there
        is none, nor a queue, and the next call tries again."""
        with self._lock:
            return self._start_locked()

    def put(self, item):
        """Queue item for the thread, started here if there is none (raises
        as start() does)."""
        with self._lock:
            self._start_locked()
            self._queue.put(item)

    def _start_locked(self):
        if self._thread is not None:
            return False
        q = queue.SimpleQueue()
        t = threading.Thread(target=self._run, args=(q,), name=self.name, daemon=True)
        t.start()
        self._queue, self._thread = q, t
        return True

    def wait(self, timeout=None):
        """Wait until every item put before this call is handled; False
        when timeout seconds passed first. True at once with no thread."""
        done = _Handled()
        with self._lock:
            if self._queue is None:
                return True
            self._queue.put(done)
        return done.wait(timeout)

    def _run(self, q):
        while True:
            got = [q.get()]
            while self._batch:  # what was put meanwhile goes in the same call
                try:
                    got.append(q.get_nowait())
                except queue.Empty:
                    break
            items = [x for x in got if not isinstance(x, _Handled)]
            try:
                if items:
                    self._handle(items if self._batch else items[0])
            except BaseException:  # the thread outlives a handler's failure: what is queued after it is handled
                logging.getLogger("gdsfs.autoload").debug("gdsfs autoload: %s", self.name, exc_info=True)
            finally:
                for x in got:
                    if isinstance(x, _Handled):
                        x.set()
