"""`python -m trainer_space [flags]`: the trainer role alone (same flags as `python app.py trainer`)."""

import argparse

from .launch import add_arguments, run

parser = argparse.ArgumentParser(prog="python -m trainer_space", description=__doc__)
add_arguments(parser)
run(parser.parse_args())
