"""`mnsim`: the command-line entry point; each package contributes its subcommands."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from hwdesc import MnsimError
from compiler.layout import cli as layout_cli
from hwdesc import cli as hw_cli
from mlsdk import commands
from mlsdk.sweep import cli as sweep_cli


def make_console() -> Console:
    """A console 120 columns wide when writing to a pipe or file (rich's default is 80)."""
    probe = Console()
    return Console(width=None if probe.is_terminal else 120)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnsim", description="MN-Core 2 simulator with an MLSDK-compatible API")
    sub = parser.add_subparsers(dest="command", required=True)
    hw_cli.register(sub)
    layout_cli.register(sub)
    commands.register(sub)
    sweep_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = make_console()
    try:
        return int(args.func(args, console) or 0)
    except MnsimError as e:
        Console(stderr=True, width=console.width).print(f"[red]error:[/red] {e}", highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
