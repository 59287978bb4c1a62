"""What a run adds around the model and the data: callbacks, logging, checkpoints, resuming, the
random state and the logged metrics."""
