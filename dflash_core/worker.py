"""One thread owns the models and runs all MLX work (MLX streams are thread-local; Gradio and
servers call from many threads). Callers submit functions or stream generators through it."""
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

    def stream(self, make_iter, cancel: threading.Event = None):
        """Iterate, on the caller's thread, over a generator that runs on the worker thread.
        Closing the returned generator early (client gone) sets `cancel` so the engine stops at
        its next cycle and the worker is free again."""
        items = queue.Queue(maxsize=64)
        cancel = cancel or threading.Event()

        def pump():
            try:
                for item in make_iter():
                    items.put(item)
            except BaseException as e:
                items.put(e)
            finally:
                items.put(_DONE)

        self.submit(pump)
        try:
            while (item := items.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()
            while item is not _DONE:  # drain so the pump never blocks on a full queue
                item = items.get()


_default = None
_lock = threading.Lock()


def default_worker() -> Worker:
    global _default
    with _lock:
        if _default is None:
            _default = Worker()
        return _default
