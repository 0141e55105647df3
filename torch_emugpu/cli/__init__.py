"""The `torch-emugpu` command (`python -m torch_emugpu`, `python -m torch_emugpu.cli`):
commands.py parses it and runs the small subcommands; the main job and
`explain` have modules of their own, and the rest are the measuring tools'
and the data path's."""

from torch_emugpu.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
