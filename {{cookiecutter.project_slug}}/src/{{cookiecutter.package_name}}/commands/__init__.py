"""The commands beside fit, validate, test and predict, one module each (`cli.TOOLS` names them), and
the modules that only they use."""
