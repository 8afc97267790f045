"""The runtime at the edge: settings meet the embedded stack, workers, the client and the CLI.

The only part of the engine that imports `workflows`, `activities` or `trainer`."""
