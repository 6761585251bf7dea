"""Options shared by the commands."""

from __future__ import annotations

import argparse

from storage.layout import STORE_ENV


def nonempty(text: str) -> str:
    """An argparse type: an empty --store or --run-id is a typo, not 'the default'."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave the option out for the default)")
    return text


STORE_HELP = (
    f"run store directory (default ${STORE_ENV}, then the config's store.root, "
    "then ./itergrpo-store)"
)


def store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=nonempty, help=STORE_HELP)
