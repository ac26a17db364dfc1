"""The `idled` command line: `idled.cli.main.main(argv) -> int` dispatches to one small module per command."""
