"""bertbench: a BERT training benchmark suite on PyTorch."""

__version__ = "0.1.0"
