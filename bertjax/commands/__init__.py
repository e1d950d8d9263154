"""One module per `bertjax` subcommand, each exposing `main(argv: list[str]) -> int`; plus
`finetune_args`, the options the fine-tuning commands share."""
