"""The images themselves: decoded from files, drawn (the built-in shapes), streamed from chunks, and
ordered for training."""
