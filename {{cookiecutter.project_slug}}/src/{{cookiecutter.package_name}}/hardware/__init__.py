"""This machine: its devices, the rules for which trainer settings they run, how FSDP shards a
backbone, and whether a server can be reached."""
