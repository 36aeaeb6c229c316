"""The OpenAI-compatible HTTP server (routes, its request queue, jobs and metrics) and the worker
thread that runs all MLX work."""
