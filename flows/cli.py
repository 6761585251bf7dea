"""Command-line entry point (placeholder until the flow lands)."""


def main() -> int:
    print("itergrpo: not yet available")
    return 0
