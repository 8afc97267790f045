"""Tasks: the model a user submits and the files (JSONL, Hugging Face datasets) they come in."""
