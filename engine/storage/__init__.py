"""Storage: PostgreSQL, blobs, Temporal payloads, traces, policy versions and batch reports."""
