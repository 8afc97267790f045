"""The plan language: what the conductor writes, how it is parsed and checked, and the prompts
that ask for it."""
