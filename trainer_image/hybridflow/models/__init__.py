"""Model folders: a tiny random model builder for tests and the demo, and a GGUF converter."""
