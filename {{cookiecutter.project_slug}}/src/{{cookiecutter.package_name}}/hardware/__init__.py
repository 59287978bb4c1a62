"""This machine: its devices, the rules for which trainer settings they run, how FSDP shards a
backbone, and the network: remote locations, whether a server can be reached."""
