"""The training loop and the session a script holds: tasks, batches, evaluation, inference, checkpoints."""
