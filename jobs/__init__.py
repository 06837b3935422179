"""ragsift jobs: the CLI entry points and the answer job's engine and strategies."""
