"""Task data layers: reading each benchmark's files, turning them into model inputs, and its metrics."""
