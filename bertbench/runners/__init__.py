"""The commands users run: the one configuration, the run directory, the fine-tuning and pre-training runners."""
