"""The models side: names, hub ids, directories and GGUF files into a loaded `Pair` (loading, pair,
registry, hub, gguf, tokenizer, memory), and the process group under `mlx.launch` (distributed)."""
