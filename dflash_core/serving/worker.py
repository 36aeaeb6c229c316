"""One thread owns the models and runs all MLX work (MLX streams are thread-local; Gradio and
servers call from many threads). Callers submit functions or stream generators through it.

The worker never waits on a reader: a streamed run's items go into an unbounded queue (a run
makes at most max_tokens of them), so a reader that stops reading cannot stall the next run.
Readers that must bound what they hold (the server's clients) do so on their side."""

import asyncio
import queue
import threading
from concurrent.futures import Future

_DONE = object()


class Worker:
    def __init__(self, name: str = "mlx-worker"):
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            fn, fut = self._jobs.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # handed to the caller, who reports it
                    fut.set_exception(e)

    def submit(self, fn, *args, **kwargs) -> Future:
        fut = Future()
        self._jobs.put((lambda: fn(*args, **kwargs), fut))
        return fut

    def call(self, fn, *args, **kwargs):
        """Run fn on the worker thread and wait for its result (exceptions re-raised here)."""
        return self.submit(fn, *args, **kwargs).result()

    def _pump(self, make_iter, cancel: threading.Event, put):
        """Queue a run that hands each item of make_iter() to put, then _DONE; an exception is
        handed over as an item. A run cancelled while it waited for the worker never starts."""

        def pump():
            try:
                if not cancel.is_set():
                    for item in make_iter():
                        put(item)
            except BaseException as e:
                put(e)
            finally:
                put(_DONE)

        self.submit(pump)

    def stream(self, make_iter, cancel: threading.Event = None):
        """Iterate, on the caller's thread, over a generator that runs on the worker thread.
        Closing the returned generator early (client gone) sets `cancel` so the engine stops at
        its next cycle and the worker is free again."""
        items = queue.Queue()
        cancel = cancel or threading.Event()
        self._pump(make_iter, cancel, items.put)
        try:
            while (item := items.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()

    async def astream(self, make_iter, cancel: threading.Event):
        """The same for a reader on an asyncio event loop: waiting for items holds no thread."""
        loop = asyncio.get_running_loop()
        items = asyncio.Queue()

        def put(item):
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the loop is closed (server shut down): nobody reads any more
                cancel.set()

        self._pump(make_iter, cancel, put)
        try:
            while (item := await items.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()


_default = None
_lock = threading.Lock()


def default_worker() -> Worker:
    global _default
    with _lock:
        if _default is None:
            _default = Worker()
        return _default
