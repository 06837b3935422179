"""Thin Ray actors: each wraps one library call, takes a batch and returns a batch."""
