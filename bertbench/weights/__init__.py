"""Weights in and out: TensorFlow 1 checkpoints without TensorFlow, Google's names, HF directories, convert, export."""
