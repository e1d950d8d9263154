"""One module per `bertjax` subcommand; each exposes `main(argv: list[str]) -> int`."""
