"""Training: its config, the step, the loop, resumable state, checkpoint files, optimizers, devices, processes."""
