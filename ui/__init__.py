"""The Gradio playground over the DFlash engine's events. `build_app(...)` returns
(gr.Blocks, launch_kwargs) for `launch` or `gr.mount_gradio_app`."""

from .app import build_app

__all__ = ["build_app"]
