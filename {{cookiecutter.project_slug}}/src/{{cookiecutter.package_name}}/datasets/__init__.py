"""The images themselves: found in class folders and split, decoded from files, drawn (the built-in
shapes),{{ " streamed from chunks," if cookiecutter.streaming == "yes" }} and ordered for training."""
