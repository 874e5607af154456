"""The `tandem` command line: one typer app with a subcommand per stage."""
