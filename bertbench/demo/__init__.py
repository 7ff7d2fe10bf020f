"""The built-in demo: a synthetic sentence-pair task that needs no network, trained with both modeling modules."""
