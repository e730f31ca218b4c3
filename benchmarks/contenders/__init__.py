"""One module per contender, each run as its own process through `common.main`."""
