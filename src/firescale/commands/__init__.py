"""Command modules of the `firescale` CLI: each has add_arguments(parser) and run(args)."""
