"""``python -m gpufeed`` (and ``torchrun -m gpufeed``) runs the CLI."""

from gpufeed.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
