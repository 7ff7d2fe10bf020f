"""The network: its config and named sizes, the baseline BERT, the unpadded path, recompute policies, the factory."""
